"""The remote command catalogue: every value quoted, structure immune to hostile config."""

from __future__ import annotations

import re
import shlex
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.reading import cache_entries
from sparkd.core.spec import container_name, serve_log_path
from sparkd.model.cluster import ClusterSpec
from sparkd.shell import catalogue
from tests.toy import reference_cluster

TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
HOSTILE = st.one_of(
    TEXT,
    st.sampled_from(["$(reboot)", "`id`", "a;b", "x' y", 'q"uote', "--flag", "a b\nc", "*", "~"]),
)


def changed(**parts: dict[str, Any]) -> ClusterSpec:
    cluster = reference_cluster()
    update = {k: getattr(cluster, k).model_copy(update=v) for k, v in parts.items()}
    return cluster.model_copy(update=update)


def test_every_tool_runs_under_timeout() -> None:
    cluster = reference_cluster()
    for _host, remote in catalogue.catalogue(cluster, 20):
        if remote.name in ("facts", "ray_cli"):
            # Past the section functions, every line runs its tools under `timeout`.
            for line in _logical_lines(remote.command):
                if line.startswith(("s() {", "c() {")) or line == "'":
                    continue  # the functions, and the end of the newline they define
                words = shlex.split(line.replace("$(", " ").replace(");", " "))
                assert "timeout" in words, line
                if words[0] in ("s", "c"):
                    assert words[2] == "timeout", line
            continue
        for words in top_level_steps(remote.command):
            # A variable set from a command: a temporary file's name (mktemp), an image ID.
            if words and words[0][:4] in ("t=$(", "i=$(", "k=$("):
                words = shlex.split(words[0][4:].removesuffix(")"))
            if not words or words[0] in ("printf", "umask", "[", "echo", "false", "case"):
                continue  # shell builtins: nothing that can hang
            assert words[:3] == ["timeout", "-k", "2"], (remote.name, words)


def _logical_lines(script: str) -> list[str]:
    """The script's lines, a quoted argument that spans lines (a program for `python3 -c`) kept
    in the line it belongs to; the section functions' lines as they are."""
    lines: list[str] = []
    pending = ""
    for line in script.splitlines():
        if not pending and (line.startswith(("s() {", "c() {")) or line == "'"):
            lines.append(line)
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending)
        except ValueError:
            continue  # a quote still open: the argument goes on in the next line
        lines.append(pending)
        pending = ""
    assert not pending, pending
    return lines


def top_level_steps(command: str) -> list[list[str]]:
    """The simple commands of a shell line, split at unquoted `;`, `&&`, `(`, `)`, `{`, `}`."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.wordchars += "${}*=/.:,@%+-"
    steps: list[list[str]] = [[]]
    for token in lexer:
        if token in (";", "&&", "||", "(", ")", "{", "}") or token.startswith(">"):
            if token.startswith(">"):
                continue
            steps.append([])
        else:
            steps[-1].append(token)
    return [step for step in steps if step]


@settings(max_examples=200, deadline=None)
@given(HOSTILE)
def test_remove_container_argv(name: str) -> None:
    remote = catalogue.actions.remove_container(name, 9)
    assert shlex.split(remote.command) == [
        "timeout",
        "-k",
        "2",
        "9",
        "docker",
        "rm",
        "-f",
        "--",
        name,
    ]


@settings(max_examples=200, deadline=None)
@given(
    HOSTILE,
    st.lists(HOSTILE, max_size=4),
    st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), HOSTILE, max_size=3),
)
def test_start_model_two_layers(model_id: str, extra: list[str], env: dict[str, str]) -> None:
    cluster = changed(model={"id": model_id, "extra_args": tuple(extra)}, ray={"env": env})
    remote = catalogue.actions.start_model(cluster, 30)
    *_, launch = remote.command.split(" && ")
    outer = shlex.split(launch)
    head = container_name(cluster, cluster.head)
    root = cluster.model.cache_root
    assert outer[:13] == [
        "timeout",
        "-k",
        "2",
        "30",
        "docker",
        "exec",
        "-d",
        "-e",
        f"VLLM_CACHE_ROOT={root}/$k-{cache_entries.model_slug(model_id)}",
        head,
        "sh",
        "-c",
        outer[12],
    ]
    assert "/" not in cache_entries.model_slug(model_id)
    record_pid, launch = outer[12].split("; ", 1)
    assert record_pid.startswith("echo $$ > ")
    inner = shlex.split(launch)
    assert inner == [
        "exec",
        *catalogue.actions.serve_argv(cluster),
        f">>{serve_log_path(cluster)}",
        "2>&1",
    ]
    assert catalogue.actions.serve_argv(cluster)[2] == model_id


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), HOSTILE, max_size=4
    ),
    st.lists(HOSTILE, max_size=3),
)
def test_docker_run_argv_round_trips(env: dict[str, str], extra: list[str]) -> None:
    cluster = changed(ray={"env": env, "extra_docker_args": tuple(extra)})
    for host in cluster.hosts:
        remote = catalogue.actions.start_ray(cluster, host, 60)
        run = remote.command.split(">/dev/null 2>&1; ", 1)[1].removesuffix("; }")
        assert shlex.split(run) == [
            "timeout",
            "-k",
            "2",
            "60",
            *catalogue.actions.docker_run_argv(cluster, host),
        ]


def test_docker_run_follows_the_playbook() -> None:
    cluster = reference_cluster()
    argv = catalogue.actions.docker_run_argv(cluster, cluster.head)
    for flag in ("--network", "--gpus", "--shm-size", "--restart=no", "--pull=never"):
        assert flag in argv
    assert "RAY_memory_monitor_refresh_ms=0" in argv
    assert "NCCL_SOCKET_IFNAME=enp1s0f0np0" in argv
    assert (
        argv[-6:]
        == [
            "ray",
            "start",
            "--block",
            "--head",
            "--node-ip-address=192.168.200.12",
            "--port=6379",
        ][-6:]
        or "--dashboard-host=127.0.0.1" in argv
    )
    worker = catalogue.actions.docker_run_argv(cluster, cluster.workers[0])
    assert worker[-4:] == [
        "--block",
        "--address=192.168.200.12:6379",
        "--node-ip-address=192.168.200.13",
    ][-4:] or worker[-3:] == [
        "--block",
        "--address=192.168.200.12:6379",
        "--node-ip-address=192.168.200.13",
    ]
    labels = [argv[i + 1] for i, a in enumerate(argv) if a == "--label"]
    assert [lab.split("=")[0] for lab in labels] == ["sparkd.cluster", "sparkd.role", "sparkd.spec"]


def test_api_key_never_on_a_command_line(tmp_path: Any) -> None:
    cluster = changed(model={"api_key_file": tmp_path / "key"})
    remote = catalogue.actions.start_model(cluster, 30, api_key="sk-very-secret")
    assert "sk-very-secret" not in remote.command
    assert remote.stdin == "sk-very-secret"
    assert "sk-very-secret" not in repr(remote)
    assert 'VLLM_API_KEY="$(cat ' in catalogue.actions.serve_shell(cluster)


def test_stop_unit_stops_and_disables_with_sudo() -> None:
    cluster = changed(ssh={"sudo": True})
    remote = catalogue.actions.stop_unit(cluster, "vllm-cluster.service", 10)
    stop, disable = remote.command.split(" && ")
    assert shlex.split(stop)[4:] == [
        "sudo",
        "-n",
        "systemctl",
        "stop",
        "--",
        "vllm-cluster.service",
    ]
    assert shlex.split(disable)[4:] == [
        "sudo",
        "-n",
        "systemctl",
        "disable",
        "--",
        "vllm-cluster.service",
    ]


def test_fact_script_is_sectioned() -> None:
    """That it changes nothing is checked against the simulated world's command log
    (tests/live/test_read_path.py)."""
    cluster = reference_cluster()
    script = catalogue.reads.fact_script(cluster, cluster.head, 10)
    for name in (
        "now",
        "boot_id",
        "units",
        "containers",
        "gpu_apps",
        "iface",
        "disk",
        "ray_nodes",
        "ray_status",
        "serve_log",
    ):
        # `s` prints a section as it comes, `c` also keeps it for the script to read again.
        assert re.search(f"[sc] {name} timeout", script.command), name
    worker = catalogue.reads.fact_script(cluster, cluster.workers[0], 10)
    assert "ray_status" not in worker.command


def test_each_ray_node_gets_its_own_vllm_host_ip() -> None:
    from sparkd.shell.catalogue.actions import docker_run_argv

    cluster = reference_cluster()
    for host in cluster.hosts:
        argv = docker_run_argv(cluster, host)
        pairs = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-e"]
        assert f"VLLM_HOST_IP={host.data_ip}" in pairs
        assert [p for p in pairs if p.startswith("VLLM_HOST_IP=")] == [
            f"VLLM_HOST_IP={host.data_ip}"
        ]


def test_ray_nodes_are_read_alive_only_so_the_row_limit_cannot_drop_them() -> None:
    from sparkd.shell.catalogue.reads import fact_script

    cluster = reference_cluster()
    script = fact_script(cluster, cluster.head, 10).command
    assert "ray list nodes --format=json --filter state=ALIVE" in script


def test_the_catalogue_lists_the_fact_script_as_observing_runs_it() -> None:
    from sparkd.shell.observe import tool_timeout

    base = reference_cluster()
    cluster = base.model_copy(update={"ray": base.ray.model_copy(update={"dashboard": False})})
    listed = [(h, r.command) for h, r in catalogue.catalogue(cluster, 30) if r.name == "facts"]
    head_reads = ((False, True), (True, True), (False, False))
    expected = [
        (
            h,
            catalogue.reads.fact_script(
                cluster, h, tool_timeout(cluster), status, read, ready
            ).command,
        )
        for h in cluster.hosts
        for ready in ((False, True) if h.role == "head" else (False,))
        for status, read in (head_reads if h.role == "head" else ((False, True),))
    ]
    # Without the dashboard, the head's with `ray status` (the node list needs the dashboard),
    # and with Ray's last reading reused (no `ray` call); a worker's has no Ray part.
    # Each also as read while a rollout prepares (the model files read too); a worker's reads
    # no model files.
    assert listed == list(dict.fromkeys(expected))


def test_with_the_dashboard_the_fact_script_runs_no_ray_and_ray_status_is_listed_alone() -> None:
    from sparkd.shell.observe import tool_timeout

    cluster = reference_cluster()
    assert cluster.ray.dashboard
    t = tool_timeout(cluster)
    listed = [(h.name, r.name, r.command) for h, r in catalogue.catalogue(cluster, 30)]
    facts = [(h, c) for h, n, c in listed if n == "facts"]
    assert facts == list(
        dict.fromkeys(
            (h.name, catalogue.reads.fact_script(cluster, h, t, False, False, ready).command)
            for h in cluster.hosts
            for ready in (False, True)
        )
    )
    assert all(" ray " not in c for _, c in facts)
    cli = [(h, c) for h, n, c in listed if n == "ray_cli"]
    assert cli == [(cluster.head.name, catalogue.reads.ray_cli(cluster, t).command)]
    assert "ray status" in cli[0][1] and "ray list" not in cli[0][1]
