"""What a real Docker engine printed (tests/fixtures/docker-real: docker.io 20.10 with the 28.x
CLI) reads as the right value with sparkd's own parsers: `ps` JSON in every state, `top` tables
(a defunct serve included), the errors of a restarting container and of a stopped daemon, and
the `docker events` lines that wake the controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import docker_failure, host_facts, unreadable
from sparkd.shell import catalogue
from sparkd.shell.events import ExecFilter, parse_event
from tests.toy import reference_cluster

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "docker-real"


def calls(prefix: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (REAL / "calls.jsonl").read_text().splitlines()]
    return [r for r in rows if r["cmd"].startswith(prefix)]


def calls_in(name: str, prefix: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (REAL / name).read_text().splitlines()]
    return [r for r in rows if r["cmd"].startswith(prefix)]


def events() -> list[str]:
    return (REAL / "events.jsonl").read_text().splitlines()


def test_every_ps_row_reads_with_its_state() -> None:
    listed = calls("docker ps")
    assert len(listed) > 20
    states = set()
    for call in listed:
        if "{{json .}}" not in call["cmd"] or call["rc"] != 0:
            continue
        rows = parsers.parse_docker_ps(call["stdout"])
        assert len(rows) == len(call["stdout"].splitlines()), call["cmd"]
        for row in rows:
            assert row.name and row.image
            states.add(row.state)
            if row.state == "restarting":
                assert row.status.startswith("Restarting (3) ")
            if row.state == "running":
                assert row.status.startswith("Up ")
    assert states == {"running", "restarting"}


def test_every_top_table_reads_and_a_defunct_serve_is_not_serving() -> None:
    # sparkd's own form, `-eo pid,...` (the default table starts with UID).
    tables = [c for c in calls("docker top") if c["rc"] == 0 and c["stdout"].startswith("PID")]
    assert len(tables) >= 3
    for call in tables:
        rows = parsers.parse_docker_top(call["stdout"])
        assert len(rows) == len(call["stdout"].splitlines()) - 1, call["cmd"]
        assert all(r.pid > 1 for r in rows)
    defunct = next(c for c in tables if "<defunct>" in c["stdout"])
    assert parsers.find_serve(parsers.parse_docker_top(defunct["stdout"])) is None


def test_a_restarting_container_is_listed_without_processes_not_unread() -> None:
    [failed, *_] = [c for c in calls("docker top crashy") if c["rc"] == 1]
    sections = {
        "boot_id": parsers.Section("b", 0),
        "containers": parsers.Section("", 0),
        "running": parsers.Section("crashy", 0),
        "top crashy": parsers.Section(failed["stdout"] + failed["stderr"], failed["rc"]),
    }
    assert unreadable(sections) is None


def test_a_stopped_daemon_is_docker_down_not_an_unreadable_host() -> None:
    [down] = [c for c in calls("docker ps") if c["rc"] == 1]
    assert down["stderr"].startswith("Cannot connect to the Docker daemon at unix://")
    sections = {
        "boot_id": parsers.Section("b", 0),
        "containers": parsers.Section(down["stdout"] + down["stderr"], down["rc"]),
        "running": parsers.Section(down["stderr"], down["rc"]),
    }
    # The host answered: Docker alone is down, its own finding (unknown never acts).
    assert unreadable(sections) is None
    down_reason = docker_failure(sections)
    assert down_reason is not None
    assert down_reason.startswith("docker failed (rc 1): Cannot connect to the Docker daemon")


def test_every_container_event_parses_and_restarts_are_die_then_start() -> None:
    lines = events()
    assert lines[-1] == "unexpected EOF"  # what the CLI prints when dockerd stops
    # The stream sparkd reads has only container events (`--filter type=container`).
    rows = [line for line in lines[:-1] if json.loads(line)["Type"] == "container"]
    parsed = [parse_event(line) for line in rows]
    assert None not in parsed
    crashy = [p.action for p in parsed if p is not None and p.name == "crashy"]
    assert "restart" not in crashy
    cycle = [a for a in crashy if a in ("start", "die")]
    assert cycle[:6] == ["start", "die", "start", "die", "start", "die"]


def test_the_serve_ending_wakes_even_with_exit_code_zero() -> None:
    """A killed EngineCore ends `vllm serve` with status 0: its `exec_die` still wakes, while
    the end of every other exec (sparkd's own reads) does not."""
    execs = ExecFilter()
    woken = []
    for line in events():
        event = parse_event(line)
        # The stream's `--filter event=...` lets only these through.
        wanted = event is not None and event.action in catalogue.reads.EVENT_ACTIONS
        if event is not None and wanted and event.action.startswith("exec_") and execs.wakes(event):
            woken.append((event.action, json.loads(line)["Actor"]["Attributes"].get("exitCode")))
    # Three serves were launched (one without libnuma died with 1); every other exec is a read.
    assert woken == [("exec_die", "1"), ("exec_die", "0"), ("exec_die", "0")]


# A `docker` on PATH for the fact script run by a real shell: `ps` renders the rows of a real
# listing through its `--format` (the template's own fields, and `{{json .}}` with spaces after
# `:` and `,`, a spelling the CLI's compact JSON does not promise to keep), `top` a header.
_STUB = """#!{python}
import json, sys
rows = [json.loads(line) for line in open({rows!r})]
args = sys.argv[1:]
if args[:1] == ["ps"]:
    fmt = args[args.index("--format") + 1]
    for row in rows:
        text = fmt.replace("{{{{json .}}}}", json.dumps(row))
        for key, value in row.items():
            text = text.replace("{{{{." + key + "}}}}", str(value))
        print(text)
elif args[:1] == ["top"]:
    print("PID ELAPSED TIME COMMAND")
else:
    sys.exit(1)
"""


def test_running_names_come_from_the_template_not_from_the_json_spelling(
    tmp_path: Path,
) -> None:
    """The fact script's running names (each then gets its `docker top`) are the listing's
    template fields, so they hold whatever spacing the JSON after them has."""
    [listing] = [
        c
        for c in calls_in("size.jsonl", "docker ps -a --no-trunc --size=false --format '{{json")
        if c["rc"] == 0
    ][:1]
    row = json.loads(listing["stdout"].splitlines()[0])
    stopped = {**row, "Names": "old-build", "State": "exited", "Status": "Exited (0) 1 hour ago"}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(f"{json.dumps(row)}\n{json.dumps(stopped)}\n")
    stub = tmp_path / "bin" / "docker"
    stub.parent.mkdir()
    stub.write_text(_STUB.format(python=sys.executable, rows=str(rows)))
    stub.chmod(0o755)
    cluster = reference_cluster()
    script = catalogue.reads.fact_script(cluster, cluster.workers[0], 5).command
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    sections = parsers.parse_sections(done.stdout)
    assert sections["running"].body.split() == ["fat"]
    assert "top fat" in sections
    listed = parsers.parse_docker_ps(sections["containers"].body)
    assert [(c.name, c.state) for c in listed] == [("fat", "running"), ("old-build", "exited")]


def test_an_exited_ray_container_reads_with_its_exit_code_and_last_line() -> None:
    """A real engine (no-ray.jsonl): sparkd's Ray command in an image without `ray`, through an
    entrypoint shell, exits 127 at once; the listing's `Status` has the code, `docker logs
    --tail` the shell's line. The fact script asks for that log only while sparkd's own
    container has exited."""
    cluster = reference_cluster()
    own = "sparkd-sparks-ray-head"
    [listing] = [
        c for c in calls_in("no-ray.jsonl", "docker ps") if '"State":"exited"' in c["stdout"]
    ]
    # The container's stderr comes out on `docker logs`' own stderr (the fact script joins both).
    [log] = [c for c in calls_in("no-ray.jsonl", f"docker logs --tail 5 -- {own}") if c["stderr"]]
    got = host_facts(
        cluster,
        cluster.head,
        {
            "boot_id": parsers.Section("b", 0),
            "containers": parsers.Section(listing["stdout"], 0),
            "running": parsers.Section("", 0),
            "exit_log": parsers.Section(log["stdout"] + log["stderr"], 0),
        },
        1000.0,
    )
    box = got.container(own)
    assert box is not None and box.state == "exited" and not box.running
    assert box.exit_code == 127
    assert box.last_line == "entrypoint.sh: exec: line 0: ray: not found"
    script = catalogue.reads.fact_script(cluster, cluster.head, 5).command
    assert (
        f'if [ "$e" = exited ]; then s exit_log timeout -k 2 5 docker logs --tail 5 -- {own}'
        in (script)
    )
