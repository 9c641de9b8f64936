"""The table of action kinds (catalogue.kinds.ACTIONS) is complete, and what its rows build is
what the executor sends, what `sparkd commands` lists, what the forced-command wrapper admits and
what the sudoers rules allow."""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path

import pytest

from sparkd.model.cluster import ClusterSpec
from sparkd.model.plan import ACTION_KINDS, Action
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.execute import Executor
from tests.support.forced import decide
from tests.toy import reference_cluster

# The wrapper also refuses a PID not below the host's pid_max.
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
# A value of each varying part as the planner would give it, unlike the listing's examples.
VALUES = {
    "container": ("vllm-old", "glm-4"),
    "pid": ("2", "4242", str(PID_MAX - 1)),
    "cache_entry": ("fedcba987654-model", catalogue.kinds.CACHE_ENTRY_EXAMPLE),
    "api_key": ("sk-one", "sk-two"),
    "nothing": ("",),
}


def clusters() -> list[ClusterSpec]:
    """The reference cluster with sudo, without and with an API key file."""
    base = reference_cluster()
    base = base.model_copy(update={"ssh": base.ssh.model_copy(update={"sudo": True})})
    model = base.model.model_copy(update={"api_key_file": Path("/etc/sparkd/api_key")})
    return [base, base.model_copy(update={"model": model})]


def values(cluster: ClusterSpec, row: catalogue.kinds.ActionSpec) -> tuple[str, ...]:
    if row.varies == "unit":
        return tuple(cluster.cleanup.units)
    return VALUES[row.varies]


def sent(cluster: ClusterSpec, host: HostSpec) -> list[tuple[catalogue.kinds.ActionSpec, str]]:
    """Every command the table's rows build for `host`, from run-time values."""
    seconds = cluster.ssh.command_timeout
    commands = []
    for row in catalogue.kinds.ACTIONS.values():
        if row.build is None or not row.on(cluster, host):
            continue
        for value in values(cluster, row):
            commands += [(row, r.command) for r in row.build(cluster, host, value, seconds)]
    return commands


def sudo_argvs(command: str) -> list[list[str]]:
    """The argv each `sudo -n` step of `command` asks sudo to run."""
    found = []
    for step in command.split(" && "):
        words = shlex.split(step)
        if "sudo" in words:
            found.append(words[words.index("sudo") + 2 :])
    return found


def sudoers_allows(rules: list[str], argv: list[str]) -> bool:
    """sudoers' matching of a command (by its full path) and its arguments: literally, with
    backslash escapes, or a regular expression between ^ and $ (sudo 1.9.10 and later)."""
    for rule in rules:
        path, _, args = rule.partition(" ")
        if Path(path).name != argv[0] or path != catalogue.actions.SUDO_PATHS[argv[0]]:
            continue
        given = " ".join(argv[1:])
        if args.startswith("^") and re.fullmatch(args[1:-1], given):
            return True
        if re.sub(r"\\(.)", r"\1", args) == given:
            return True
    return False


def test_every_action_kind_has_one_row_naming_an_executor_method() -> None:
    assert tuple(catalogue.kinds.ACTIONS) == ACTION_KINDS
    for kind, row in catalogue.kinds.ACTIONS.items():
        assert row.kind == kind
        assert inspect.iscoroutinefunction(getattr(Executor, row.handler)), row
        # Only what runs on the ops box sends nothing to a host.
        assert (row.build is None) == (row.where == "ops_box"), row


@pytest.mark.parametrize("keyed", [False, True])
def test_what_each_row_builds_passes_the_wrapper_and_sudoers(keyed: bool) -> None:
    cluster = clusters()[keyed]
    rules, refused = catalogue.kinds.sudoers_rules(cluster)
    assert refused == []
    for host in cluster.hosts:
        allowed = decide(cluster, host)
        commands = sent(cluster, host)
        assert {row.kind for row, _ in commands} >= {
            kind for kind, row in catalogue.kinds.ACTIONS.items() if row.on(cluster, host)
        }
        for row, command in commands:
            assert allowed(command), (row.kind, command)
            for argv in sudo_argvs(command):
                assert sudoers_allows(rules, argv), (row.kind, argv)


def test_the_listing_shows_each_rows_commands_on_its_hosts() -> None:
    for cluster in clusters():
        seconds = cluster.ssh.command_timeout
        listed = {(h.name, r.command) for h, r in catalogue.catalogue(cluster, seconds)}
        for host in cluster.hosts:
            for row in catalogue.kinds.ACTIONS.values():
                for remote in row.listed(cluster, host, seconds):
                    assert (host.name, remote.command) in listed, (row.kind, host.name)
                    assert remote.mutating, row.kind


def test_the_executor_sends_what_the_row_builds() -> None:
    cluster = clusters()[0]
    executor = Executor(cluster, pool=None)  # type: ignore[arg-type]  # builds, never connects
    seconds = cluster.ssh.command_timeout
    for kind in ("stop_unit", "remove_container", "start_ray_worker", "restart_ray", "prune_cache"):
        row = catalogue.kinds.ACTIONS[kind]
        assert row.build is not None
        for host in (h for h in cluster.hosts if row.on(cluster, h)):
            for value in values(cluster, row):
                action = Action(kind=kind, host=host.name, target=value or "x", reason="test")
                built = executor._built(host, action, value)
                assert built in row.build(cluster, host, value, seconds)


def test_a_kind_that_varies_by_a_pattern_is_refused_outside_it() -> None:
    cluster = clusters()[0]
    seconds = cluster.ssh.command_timeout
    host = cluster.head
    allowed = decide(cluster, host)
    # Outside cleanup.container_patterns, PID 1, and a path outside the cache.
    assert not allowed(catalogue.actions.remove_container("postgres", seconds).command)
    assert not allowed(catalogue.actions.kill_process(cluster, 4242, "HUP", seconds).command)
    bad = catalogue.actions.prune_cache(
        cluster, host, catalogue.kinds.CACHE_ENTRY_EXAMPLE, seconds
    ).command
    assert not allowed(bad.replace(catalogue.kinds.CACHE_ENTRY_EXAMPLE, "../etc"))


def test_the_docs_list_every_action_kind_in_the_tables_order() -> None:
    text = (Path(__file__).parents[2] / "docs" / "how-it-decides.md").read_text()
    paragraph = text[text.index("Action kinds: ") :].split("\n\n", 1)[0]
    named = [n for n in re.findall(r"`([a-z_]+)`", paragraph) if n in catalogue.kinds.ACTIONS]
    assert named == list(catalogue.kinds.ACTIONS)
