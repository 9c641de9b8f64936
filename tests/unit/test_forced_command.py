"""The forced-command wrapper's decisions, in process and as the program sshd would run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.spec import good_of, spec_of
from sparkd.model import exits
from sparkd.model.cluster import ClusterSpec
from sparkd.shell import catalogue, forced
from tests.support.forced import KEY, decide
from tests.toy import EXAMPLE_CONFIG, reference_cluster

PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


def with_key_file(cluster: ClusterSpec) -> ClusterSpec:
    model = cluster.model.model_copy(update={"api_key_file": Path("/etc/sparkd/api_key")})
    return cluster.model_copy(update={"model": model})


@pytest.mark.parametrize("keyed", [False, True])
def test_every_command_sparkd_sends_a_host_passes_its_wrapper(keyed: bool) -> None:
    cluster = reference_cluster()
    cluster = with_key_file(cluster) if keyed else cluster
    seconds = cluster.ssh.command_timeout
    for host in cluster.hosts:
        allowed = decide(cluster, host)
        sent = [
            r.command
            for h, r in catalogue.catalogue(cluster, seconds)
            if h.name == host.name and r.name not in ("remove_container", "start_model")
        ]
        for pid in (2, 9, 4100, PID_MAX - 1):
            for signal in forced.SIGNALS:
                sent.append(catalogue.actions.kill_process(cluster, pid, signal, seconds).command)
        sent += [
            catalogue.actions.remove_container(n, seconds).command for n in ("glm-4", "vllm-old")
        ]
        if host.role == "head":
            sent += [
                catalogue.actions.signal_serve(cluster, s, seconds).command for s in forced.SIGNALS
            ]
            for key in ("sk-one", "sk-two"):  # a rotated key changes the spec hash
                sent.append(
                    catalogue.actions.start_model(cluster, seconds, key if keyed else None).command
                )
        for command in sent:
            assert allowed(command), command


def test_the_actual_observation_and_events_commands_pass() -> None:
    from sparkd.shell.observe import tool_timeout

    base = reference_cluster()
    for dashboard in (True, False):
        cluster = base.model_copy(
            update={"ray": base.ray.model_copy(update={"dashboard": dashboard})}
        )
        t = tool_timeout(cluster)
        for host in cluster.hosts:
            allowed = decide(cluster, host)
            # With the dashboard Ray is read over HTTP, the CLI's `ray status` when it is
            # silent; without, by the script. Without `read_ray`: the last reading is reused.
            for read_ray in (False,) if dashboard else (True, False):
                for ray_status in (False, True):
                    script = catalogue.reads.fact_script(cluster, host, t, ray_status, read_ray)
                    assert allowed(script.command), (host.name, ray_status, read_ray)
            if dashboard and host.role == "head":
                assert allowed(catalogue.reads.ray_cli(cluster, t).command)
            assert allowed(catalogue.reads.docker_events(catalogue.reads.EVENTS_SPAN).command)


def test_shapes_outside_the_catalogue_are_refused() -> None:
    cluster = reference_cluster()
    head, worker = cluster.head, cluster.workers[0]
    allowed = decide(cluster, head)
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds).command
    refused = [
        "",
        "id",
        "sh -c id",
        kill.replace("4100", "1"),
        kill.replace("4100", "0"),
        kill.replace("4100", "-1"),
        kill.replace("4100", "04100"),
        kill.replace("4100", "4100 4101"),
        # procps `kill` reads these modulo 2^32: -1 (every process), 0 (its group), 1 (init).
        kill.replace("4100", "4294967295"),
        kill.replace("4100", "4294967296"),
        kill.replace("4100", "4294967297"),
        kill.replace("4100", "10000000"),
        # Not a PID on this host: at or above its own pid_max.
        kill.replace("4100", str(PID_MAX)),
        kill.replace("-TERM", "-HUP"),
        kill + "\n",
        kill + "; id",
        catalogue.actions.remove_container("postgres", seconds).command,
        catalogue.actions.remove_container("glm-x; id", seconds).command,
        catalogue.actions.remove_container("glm-*", seconds).command,
        catalogue.reads.fact_script(
            cluster, worker, catalogue.remote.tool_timeout(cluster)
        ).command,
        catalogue.actions.start_ray(cluster, worker, seconds).command,
        catalogue.reads.fact_script(cluster, head, seconds + 1).command,
        catalogue.actions.start_model(cluster, seconds, None).command.replace(
            "vllm serve", "vllm  serve"
        ),
    ]
    for command in refused:
        assert not allowed(command), command
    # The spec hash is free only where a key file makes it vary; both places must agree.
    keyed = with_key_file(cluster)
    text = catalogue.actions.start_model(keyed, seconds, "sk-one").command
    spec = text.split("printf '%s\\n' ", 1)[1].split(" ", 1)[0]
    assert decide(keyed, head)(text)
    assert not decide(keyed, head)(text.replace(spec, "0" * 12, 1))
    assert not allowed(text)


ALLOWED_HEAD = decide(reference_cluster(), reference_cluster().head)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_one_character_more_or_less_in_the_fact_script_is_refused(data: st.DataObject) -> None:
    cluster = reference_cluster()
    head = cluster.head
    script = catalogue.reads.fact_script(
        cluster, head, catalogue.remote.tool_timeout(cluster)
    ).command
    at = data.draw(st.integers(0, len(script)))
    extra = data.draw(st.characters(codec="utf-8"))
    assert not ALLOWED_HEAD(script[:at] + extra + script[at:])
    if at < len(script):
        assert not ALLOWED_HEAD(script[:at] + script[at + 1 :])


def run_wrapper(program: Path, command: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_ORIGINAL_COMMAND"}
    if command is not None:
        env["SSH_ORIGINAL_COMMAND"] = command
    return subprocess.run(
        [sys.executable, str(program), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_the_program_refuses_with_126_naming_only_the_first_word(tmp_path: Path) -> None:
    cluster = reference_cluster()
    program = tmp_path / "wrapper"
    program.write_text(forced.wrapper(cluster, cluster.head, KEY))
    secret = "curl -H 'Authorization: Bearer sk-secret' http://x"
    refused = run_wrapper(program, secret)
    assert refused.returncode == exits.REFUSED_EXIT
    assert refused.stderr == "sparkd forced command: refused curl\n"
    assert refused.stdout == ""
    login = run_wrapper(program, None)  # an interactive login: no command at all
    assert login.returncode == exits.REFUSED_EXIT
    assert login.stderr == "sparkd forced command: refused (no command)\n"
    odd = run_wrapper(program, "$(rm\x1b[2J -rf /) x")
    assert odd.stderr == "sparkd forced command: refused ??rm??2J\n"
    seconds = cluster.ssh.command_timeout
    fine = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds).command
    assert run_wrapper(program, fine, "--check").returncode == 0
    assert run_wrapper(program, "id", "--check").returncode == exits.REFUSED_EXIT


def test_the_program_runs_an_allowed_command_in_sh(tmp_path: Path) -> None:
    """Let through, the command runs as `sh -c` would run it, stdin included."""
    cluster = reference_cluster()
    program = tmp_path / "wrapper"
    program.write_text(forced.wrapper(cluster, cluster.head, KEY))
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "kill").write_text('#!/bin/sh\necho "kill $*"; cat\n')
    (tools / "kill").chmod(0o755)
    command = catalogue.actions.kill_process(
        cluster, 4100, "KILL", cluster.ssh.command_timeout
    ).command
    env = dict(os.environ, SSH_ORIGINAL_COMMAND=command, PATH=f"{tools}:{os.environ['PATH']}")
    done = subprocess.run(
        [sys.executable, str(program)], env=env, input="from stdin\n", capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "kill -KILL 4100\nfrom stdin\n")


def test_the_key_reaches_neither_rays_dashboard_port_nor_its_job_api() -> None:
    """Ray's job API listens on the dashboard's port: `POST /api/jobs/` runs its entrypoint as
    root in the head's container (real Ray 2.60 behind real OpenSSH ran `id > FILE` so). The
    head's line opens no channel there, and the wrapper admits only sparkd's fixed GETs."""
    cluster = reference_cluster()
    assert cluster.ray.dashboard  # the default
    head = cluster.head
    port = cluster.ray.dashboard_port
    opened = re.findall(r'permitopen="([^"]*)"', forced.authorized_keys_line(cluster, head, KEY))
    assert opened == [f"{cluster.model_host}:{cluster.model.port}"]
    allowed = decide(cluster, head)
    reads = catalogue.reads.dashboard_reads(cluster)
    assert [r.name for r in reads] == ["dashboard_get"] * len(catalogue.reads.DASHBOARD_PATHS)
    assert all(allowed(r.command) for r in reads)
    nodes = reads[0].command
    jobs = f"http://127.0.0.1:{port}/api/jobs/"
    job = '{"entrypoint": "id > /tmp/owned"}'
    attacks = [
        f"curl -X POST {jobs} -H 'Content-Type: application/json' -d {shlex.quote(job)}",
        f"curl -sS --data-binary @- {jobs}",
        f"curl {jobs}",
        f"curl -X DELETE {jobs}raysubmit_1",
        f"curl http://127.0.0.1:{port}/api/v0/nodes",
        f'python3 -c \'import urllib.request as u; u.urlopen("{jobs}", b"{{}}")\'',
        # sparkd's own command, bent: another path, method, port, host, cap, or more after it.
        nodes.replace(shlex.quote(catalogue.reads.DASHBOARD_PATHS[0]), "/api/jobs/"),
        nodes.replace(shlex.quote(catalogue.reads.DASHBOARD_PATHS[0]), "/api/v0/nodes"),
        nodes.replace("'GET'", "'POST'").replace("GET", "POST"),
        nodes.replace(f" {port} ", f" {port + 1} "),
        nodes.replace(" 127.0.0.1 ", " 10.0.0.1 "),
        nodes.replace(f" {catalogue.reads.DASHBOARD_MAX_ANSWER} ", " 999999999 "),
        nodes + " extra",
        nodes + f"; curl -X POST {jobs}",
        nodes + f" && curl -X POST {jobs}",
        nodes + "\n",
    ]
    for command in attacks:
        assert not allowed(command), command
    with pytest.raises(ValueError, match="not a dashboard read"):
        catalogue.reads.dashboard_get(port, "/api/jobs/", catalogue.remote.tool_timeout(cluster))
    # Without the dashboard, no read of it passes either.
    off = cluster.model_copy(update={"ray": cluster.ray.model_copy(update={"dashboard": False})})
    assert catalogue.reads.dashboard_reads(off) == []
    assert not decide(off, off.head)(nodes)


def test_the_authorized_keys_lines() -> None:
    cluster = reference_cluster()
    head, worker = cluster.head, cluster.workers[0]
    assert forced.authorized_keys_line(cluster, worker, KEY) == (
        f'command="{forced.WRAPPER_PATH}",restrict {KEY}'
    )
    assert forced.authorized_keys_line(cluster, head, KEY) == (
        f'command="{forced.WRAPPER_PATH}",restrict,port-forwarding,'
        f'permitopen="{cluster.model_host}:{cluster.model.port}" {KEY}'
    )
    off = cluster.ray.model_copy(update={"dashboard": False})
    line = forced.authorized_keys_line(cluster.model_copy(update={"ray": off}), head, KEY)
    assert "127.0.0.1" not in line
    ipv6 = cluster.model.model_copy(update={"tunnel_host": "::1"})
    line = forced.authorized_keys_line(cluster.model_copy(update={"model": ipv6}), head, KEY)
    assert f'permitopen="[::1]:{cluster.model.port}"' in line


def test_sparkd_commands_forced_command_prints_the_wrapper_and_its_line(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(EXAMPLE_CONFIG),
             *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    cluster = reference_cluster()
    one = cli("--forced-command", "--host", cluster.workers[0].name)
    assert one.returncode == 0, one.stderr
    assert one.stdout == forced.wrapper(cluster, cluster.workers[0], forced.public_key(cluster.ssh))
    assert one.stdout.startswith("#!/usr/bin/python3\n")
    assert "REGENERATE AND REINSTALL IT WHENEVER THE CONFIG" in one.stdout
    assert f'# command="{forced.WRAPPER_PATH}",restrict ' in one.stdout
    every = cli("--forced-command")
    assert every.returncode == 0
    assert every.stdout.count("#!/usr/bin/python3\n") == len(cluster.hosts)
    assert "permitopen=" in every.stdout and "AllowTcpForwarding local" in every.stdout
    assert cli("--forced-command", "--host", "nope").returncode == 64
    assert cli("--host", cluster.head.name).returncode == 64


def test_the_wrapper_takes_the_last_good_spec_a_rollback_launches(tmp_path: Path) -> None:
    """A rollback launches the last-good spec the state dir remembers: the wrapper generated
    with that memory lets its `start_model` through, and still no other spec's."""
    from sparkd.model.memory import Memory
    from sparkd.runtime.state import StateDir

    cluster = reference_cluster()
    head = cluster.head

    def flagged(*flags: str) -> ClusterSpec:
        model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, *flags)})
        return cluster.model_copy(update={"model": model})

    old, other = flagged("--max-num-seqs", "8"), flagged("--max-num-seqs", "9")
    state = tmp_path / "state"
    state.mkdir()
    good = good_of(old, None, 1000.0)
    StateDir(state).memory_path(cluster.name).write_text(Memory(last_good=good).model_dump_json())
    config = tmp_path / "sparkd.toml"
    text = EXAMPLE_CONFIG.read_text()
    assert 'state_dir = "/var/lib/sparkd"' in text
    config.write_text(text.replace('state_dir = "/var/lib/sparkd"', f'state_dir = "{state}"'))
    seconds = cluster.ssh.command_timeout
    acting = spec_of(cluster, good)
    # Not asked for: the header says what it differs by, and that it is not admitted.
    plain = _forced(config)
    assert plain.returncode == 0, plain.stderr
    assert "# last-good spec " in plain.stdout and "model.extra_args" in plain.stdout
    assert "NOT admitted" in plain.stdout
    assert not _allowed(plain.stdout)(catalogue.actions.start_model(acting, seconds, None).command)
    done = _forced(config, "--last-good")
    assert done.returncode == 0, done.stderr
    assert "model.extra_args" in done.stdout and "admitted (--last-good)" in done.stdout
    allowed = _allowed(done.stdout)
    assert allowed(catalogue.actions.start_model(acting, seconds, None).command)
    assert allowed(catalogue.actions.start_model(cluster, seconds, None).command)
    assert not allowed(catalogue.actions.start_model(other, seconds, None).command)
    review = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(config), "--last-good"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert review.returncode == 0, review.stderr
    listed = f"## start_model on {head.name} (changes, of the last-good spec a rollback launches)\n"
    assert listed + catalogue.actions.start_model(acting, seconds, None).command in review.stdout


def _state_with_last_good(tmp_path: Path, good: Any) -> Path:
    """A config whose state dir remembers `good` as its last-good spec (no spec history yet:
    a state dir from before it existed)."""
    from sparkd.model.memory import Memory
    from sparkd.runtime.state import StateDir

    cluster = reference_cluster()
    state = tmp_path / "state"
    state.mkdir()
    StateDir(state).memory_path(cluster.name).write_text(Memory(last_good=good).model_dump_json())
    config = tmp_path / "sparkd.toml"
    text = EXAMPLE_CONFIG.read_text()
    config.write_text(text.replace('state_dir = "/var/lib/sparkd"', f'state_dir = "{state}"'))
    return config


def _forced(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    head = reference_cluster().head
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(config),
         "--forced-command", "--host", head.name, *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _allowed(wrapper: str) -> Callable[[str], bool]:
    namespace: dict[str, Any] = {"__name__": "sparkd_forced_wrapper"}
    exec(compile(wrapper, "wrapper", "exec"), namespace)
    found: Callable[[str], bool] = namespace["allowed"]
    return found


def _commands_of(spec: ClusterSpec, host: str) -> list[str]:
    seconds = spec.ssh.command_timeout
    return [r.command for h, r in catalogue.catalogue(spec, seconds) if h.name == host]


def test_a_last_good_spec_wider_than_the_config_never_passes_the_wrapper(tmp_path: Path) -> None:
    """The state dir's last-good spec runs Ray `--privileged -v /:/host` with a command in its
    environment, its hash made to match: the wrapper says so in its header and lets none of
    its commands through; `--last-good` refuses to admit it."""
    from tests.support.hostile import hostile

    cluster = reference_cluster()
    evil = hostile(cluster)
    config = _state_with_last_good(tmp_path, good_of(evil, None, 1000.0))
    done = _forced(config)
    assert done.returncode == 0, done.stderr
    assert "wider than the config in a security-relevant field" in done.stdout
    assert "ray.extra_docker_args" in done.stdout
    allowed = _allowed(done.stdout)
    privileged = [c for c in _commands_of(evil, cluster.head.name) if "--privileged" in c]
    assert privileged and not any(allowed(c) for c in privileged)
    admitted = _forced(config, "--last-good")
    assert admitted.returncode == exits.EX_DATAERR, admitted.stdout[:200]
    assert admitted.stdout == "" and "ray.extra_docker_args" in admitted.stderr
    assert "ray.env names" in admitted.stderr
    review = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    listed = [line for line in review.stdout.splitlines() if not line.startswith("#")]
    assert review.returncode == 0 and not any("--privileged" in line for line in listed)
    assert "# last-good spec" in review.stdout and "ray.extra_docker_args" in review.stdout


def test_a_last_good_spec_whose_sections_do_not_make_its_hash_is_not_admitted(
    tmp_path: Path,
) -> None:

    cluster = reference_cluster()
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, "--x")})
    old = cluster.model_copy(update={"model": model})
    good = good_of(old, None, 1000.0).model_copy(update={"hash": "0123456789ab"})
    config = _state_with_last_good(tmp_path, good)
    done = _forced(config)
    assert done.returncode == 0, done.stderr
    assert "do not make its hash" in done.stdout
    start = catalogue.actions.start_model(spec_of(cluster, good), cluster.ssh.command_timeout, None)
    assert not _allowed(done.stdout)(start.command)
    refused = _forced(config, "--last-good")
    assert refused.returncode == exits.EX_DATAERR and "do not make its hash" in refused.stderr
