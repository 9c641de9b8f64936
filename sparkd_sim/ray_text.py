"""What the `ray` CLI prints when it cannot reach a cluster, and its other fixed texts, as Ray
2.60 prints them (tests/fixtures/ray-real)."""

from __future__ import annotations

_SITE = "/usr/local/lib/python3.12/dist-packages"

NO_CLUSTER = (
    "ConnectionError: Could not find any running Ray instance. Please specify the one to connect "
    "to by setting the `--address` flag or `RAY_ADDRESS` environment variable."
)
NO_CLUSTER_STATUS = (
    "No cluster status. It may take a few seconds for the Ray internal services to start up."
)
NO_RESOURCE = "No resource in the cluster"

_CLI_FRAMES = (
    '  File "/usr/local/bin/ray", line 8, in <module>',
    "    sys.exit(main())",
    "             ^^^^^^",
    '  File "{site}/ray/scripts/scripts.py", line 3021, in main',
    "    return cli()",
    "           ^^^^^",
    '  File "{site}/click/core.py", line 1653, in __call__',
    "    return self.main(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/click/core.py", line 1560, in main',
    "    rv = self.invoke(ctx)",
    "         ^^^^^^^^^^^^^^^^",
    '  File "{site}/click/core.py", line 2054, in invoke',
    "    return _process_result(sub_ctx.command.invoke(sub_ctx))",
    "                           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/click/core.py", line 1414, in invoke',
    "    return ctx.invoke(self.callback, **ctx.params)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/click/core.py", line 911, in invoke',
    "    return callback(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^",
)
_STATUS_FRAMES = (
    '  File "{site}/ray/scripts/scripts.py", line 2391, in status',
    "    address = services.canonicalize_bootstrap_address_or_die(address)",
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/ray/_private/services.py", line 753, in canonicalize_bootstrap_address_or_die',
    "    raise ConnectionError(",
)
_LIST_FRAMES = (
    '  File "{site}/ray/util/state/state_cli.py", line 605, in ray_list',
    "    client = StateApiClient(address=address)",
    "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/ray/util/state/api.py", line 144, in __init__',
    "    api_server_url = get_address_for_submission_client(address)",
    "                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/ray/dashboard/utils.py", line 745, in get_address_for_submission_client',
    "    address = ray_address_to_api_server_url(address)",
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/ray/dashboard/utils.py", line 687, in ray_address_to_api_server_url',
    "    address = services.canonicalize_bootstrap_address_or_die(address)",
    "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "{site}/ray/_private/services.py", line 753, in canonicalize_bootstrap_address_or_die',
    "    raise ConnectionError(",
)


def no_cluster_traceback(command: str) -> str:
    """The ~30-line traceback `ray status` / `ray list` print on stderr with no Ray to reach."""
    frames = _CLI_FRAMES + (_STATUS_FRAMES if command == "status" else _LIST_FRAMES)
    lines = ["Traceback (most recent call last):", *(f.format(site=_SITE) for f in frames)]
    return "\n".join([*lines, NO_CLUSTER]) + "\n"


LIST_USAGE = (
    "Usage: ray list [OPTIONS] {actors|jobs|placement-groups|nodes|workers|tasks|objects|"
    "runtime-envs|cluster-events}\nTry 'ray list --help' for help.\n"
)


def no_dashboard(limit: int) -> str:
    """`ray list nodes` with the dashboard off: click's usage error (exit 2)."""
    url = (
        "http://127.0.0.1:8265/api/v0/nodes"
        f"?limit={limit}&timeout=30&detail=False&exclude_driver=True&server_timeout_multiplier=0.8"
    )
    return (
        LIST_USAGE + "\nError: Failed to make request to http://127.0.0.1:8265/api/v0/nodes. "
        "Failed to connect to API server. Please check the API server log for details. "
        "Make sure dependencies are installed with `pip install ray[default]`. "
        "Please also check dashboard is available, and included when starting ray cluster, "
        "i.e. `ray start --include-dashboard=True --head`. "
        f"Response(url={url},status=None)\n"
    )
