"""Each fake tool, over real SSH, against the real tools' formats in tests/fixtures/samples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncssh

from sparkd_sim.world import World
from tests.sim.conftest import eventually, run, sample

DOCKER_REAL = Path(__file__).resolve().parent.parent / "fixtures" / "docker-real" / "calls.jsonl"

APPS_QUERY = (
    "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits"
)


async def test_path_resolves_every_tool_to_the_fakes(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    result = await run(head, "command -v docker systemctl nvidia-smi kill ray vllm ip df cat")
    assert result.exit_status == 0
    resolved = result.stdout.split()
    tools = ["docker", "systemctl", "nvidia-smi", "kill", "ray", "vllm", "ip", "df", "cat"]
    assert resolved == [str(world.bin_dir / t) for t in tools]


async def test_sessions_start_clean_and_unprivileged(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    result = await run(head, "env; id -u")
    lines = result.stdout.splitlines()
    env = dict(line.split("=", 1) for line in lines[:-1])
    assert env["PATH"].split(":")[0] == str(world.bin_dir)
    assert not any(key.startswith(("SSH_", "PYTHON", "VIRTUAL_ENV")) for key in env)
    if world.run_as is not None:
        assert lines[-1] != "0"


async def test_boot_id_and_other_cat_calls(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    result = await run(head, "cat /proc/sys/kernel/random/boot_id")
    assert result.stdout == world.hosts["spark-a"].state.boot_id + "\n"
    assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\n", result.stdout)
    other = await run(head, "echo hi > note && cat note")
    assert other.stdout == "hi\n"


async def test_docker_ps_json_matches_the_real_shape(head: asyncssh.SSHClientConnection) -> None:
    # As the real CLI printed it (tests/fixtures/docker-real); the hand-written sample's
    # Command is the seed's image's.
    calls = [json.loads(line) for line in DOCKER_REAL.read_text().splitlines()]
    captured = next(c for c in calls if c["cmd"] == "docker ps -a --no-trunc --format {{json .}}")
    keys = list(json.loads(captured["stdout"].splitlines()[0]))
    real = [json.loads(line) for line in sample("docker-ps.jsonl").splitlines()]
    result = await run(head, "docker ps -a --no-trunc --format '{{json .}}'")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert list(row) == keys  # same keys, same (alphabetical) order
    assert row["Platform"] is None
    assert re.fullmatch(r"0B \(virtual [0-9.]+[kMG]?B\)", row["Size"])
    assert row["Names"] == "glm-flash"
    assert row["Image"] == "hellohal2064/vllm-glm47-gb10:latest"
    assert row["State"] == "running"
    assert row["Status"].startswith("Up ")
    assert row["Command"] == real[0]["Command"]
    assert re.fullmatch(r"[0-9a-f]{64}", row["ID"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+0000 UTC", row["CreatedAt"])


async def test_docker_ps_filters(world: World, head: asyncssh.SSHClientConnection) -> None:
    by_label = await run(
        head, "docker ps -a --filter label=com.docker.compose.project=glm --format '{{.Names}}'"
    )
    assert by_label.stdout == "glm-flash\n"
    none = await run(head, "docker ps -a --filter label=sparkd.cluster=sparks -q")
    assert none.stdout == ""
    by_name = await run(head, "docker ps -a --filter name=glm --format '{{.Names}} {{.State}}'")
    assert by_name.stdout == "glm-flash running\n"


async def test_docker_run_conflict_and_missing_image(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    glm = world.hosts["spark-a"].state.container("glm-flash")
    assert glm is not None
    conflict = await run(head, "docker run -d --name glm-flash --pull=never busybox true")
    assert conflict.exit_status == 125
    assert (
        f'docker: Error response from daemon: Conflict. The container name "/glm-flash" is '
        f'already in use by container "{glm.id}". You have to remove (or rename) that container '
        "to be able to reuse that name." in conflict.stderr
    )
    missing = await run(head, "docker run -d --name x --pull=never nosuch/image sleep 1")
    assert missing.exit_status == 125
    assert missing.stderr.startswith(
        "docker: Error response from daemon: No such image: nosuch/image:latest"
    )
    unknown = await run(head, "docker run --bogus -d img")
    assert unknown.exit_status == 125
    assert unknown.stderr.startswith("unknown flag: --bogus")
    verb = await run(head, "docker frobnicate")
    assert verb.exit_status == 1
    assert "unknown command: docker frobnicate" in verb.stderr


async def test_docker_inspect_logs_top_and_rm(head: asyncssh.SSHClientConnection) -> None:
    inspect = await run(head, "docker inspect glm-flash")
    [value] = json.loads(inspect.stdout)
    assert value["Name"] == "/glm-flash"
    assert value["State"]["Running"] is True
    assert value["HostConfig"]["RestartPolicy"]["Name"] == "always"
    assert value["Config"]["Labels"] == {"com.docker.compose.project": "glm"}
    assert value["Mounts"][0]["Destination"] == "/models"
    fmt = await run(head, "docker inspect -f '{{.State.Status}} {{json .Config.Labels}}' glm-flash")
    assert fmt.stdout == 'running {"com.docker.compose.project":"glm"}\n'
    # The executor reads a container's spec label so (a missing key is nothing).
    template = '{{.State.Running}} {{index .Config.Labels "com.docker.compose.project"}}|'
    labelled = await run(
        head, f"docker inspect --format '{template}{{{{index .Config.Labels \"x\"}}}}|' glm-flash"
    )
    assert labelled.stdout == "true glm||\n"
    missing = await run(head, "docker inspect nope")
    assert (missing.exit_status, missing.stdout, missing.stderr) == (
        1,
        "[]\n",
        "Error: No such object: nope\n",
    )
    top = await run(head, "docker top glm-flash -eo pid,etimes,args")
    header, *procs = top.stdout.splitlines()
    assert header.split() == ["PID", "ELAPSED", "COMMAND"]
    assert procs and procs[0].split()[2:4] == ["bash", "-c"]
    busy = await run(head, "docker rm glm-flash")
    assert busy.exit_status == 1 and "You cannot remove a running container" in busy.stderr
    removed = await run(head, "docker rm -f glm-flash")
    assert (removed.exit_status, removed.stdout) == (0, "glm-flash\n")
    # Forced, a container already gone is no failure, as with the real CLI (28.x).
    gone = await run(head, "docker rm -f glm-flash")
    assert gone.exit_status == 0
    assert gone.stderr == "Error response from daemon: No such container: glm-flash\n"


async def test_docker_exec(world: World, head: asyncssh.SSHClientConnection) -> None:
    out = await run(head, "docker exec -e EXTRA=1 glm-flash sh -c 'echo $EXTRA $HOSTNAME; exit 3'")
    assert (out.exit_status, out.stdout) == (3, "1 spark-a\n")
    stdin = await run(head, "docker exec -i glm-flash cat", input="secret\n")
    assert stdin.stdout == "secret\n"
    detached = await run(head, "docker exec -d glm-flash sh -c 'echo lost; exit 4'")
    assert (detached.exit_status, detached.stdout) == (0, "")
    await run(head, "docker stop glm-flash")
    stopped = await run(head, "docker exec glm-flash true")
    glm = world.hosts["spark-a"].state.container("glm-flash")
    assert glm is not None
    assert stopped.exit_status == 1
    assert stopped.stderr == f"Error response from daemon: Container {glm.id} is not running\n"
    nosuch = await run(head, "docker exec nope true")
    assert nosuch.stderr == "Error response from daemon: No such container: nope\n"


async def test_systemctl_matches_the_sample(head: asyncssh.SSHClientConnection) -> None:
    await run(head, "systemctl stop vllm-proxy.service && systemctl disable vllm-proxy.service")
    result = await run(
        head,
        "systemctl show -p Id,LoadState,ActiveState,SubState,UnitFileState "
        "vllm-cluster.service vllm-proxy.service vllm-reranker-missing.service",
    )
    expected = sample("systemctl-show.txt").split("\n", 1)[1]
    assert result.stdout == expected.replace(
        "vllm-reranker.service", "vllm-reranker-missing.service"
    )
    active = await run(head, "systemctl is-active vllm-cluster.service vllm-proxy.service")
    assert (active.exit_status, active.stdout) == (3, "active\ninactive\n")
    enabled = await run(head, "systemctl is-enabled vllm-proxy.service")
    assert (enabled.exit_status, enabled.stdout) == (1, "disabled\n")
    missing = await run(head, "systemctl stop nope.service")
    assert missing.exit_status == 5
    assert missing.stderr == "Failed to stop nope.service: Unit nope.service not loaded.\n"
    bad = await run(head, "systemctl frob x")
    assert bad.exit_status == 1 and "Unknown command verb frob" in bad.stderr


async def test_nvidia_smi_matches_the_gb10_sample(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    lines = sample("nvidia-smi-gb10.txt").splitlines()
    query = lines[0].removeprefix("$ ")
    result = await run(head, query)
    real = lines[1].split(", ")
    got = result.stdout.strip().split(", ")
    assert len(got) == len(real)
    assert got[0] == real[0] and got[2:] == real[2:]  # all but the UUID
    assert got[1] == world.hosts["spark-a"].state.gpu_uuid
    apps = await run(head, APPS_QUERY)
    assert (apps.exit_status, apps.stdout) == (0, "")  # Xorg and gnome-shell are graphics only
    await world.fault("stray-gpu", "spark-a")
    apps = await run(head, APPS_QUERY)
    assert re.fullmatch(r"\d+, /usr/bin/python3, 96073\n", apps.stdout)
    table = await run(head, "nvidia-smi")
    assert "/usr/lib/xorg/Xorg" in table.stdout and " G " in table.stdout
    bad = await run(head, "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.exit_status == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr


async def test_ip_df_and_kill(world: World, head: asyncssh.SSHClientConnection) -> None:
    ip = await run(head, "ip -j addr show dev enp1s0f0np0")
    [link] = json.loads(ip.stdout)
    assert link["ifname"] == "enp1s0f0np0" and link["operstate"] == "UP"
    assert [a["local"] for a in link["addr_info"]] == [world.hosts["spark-a"].state.data_ip]
    missing = await run(head, "ip -j addr show dev eth9")
    assert (missing.exit_status, missing.stderr) == (1, 'Device "eth9" does not exist.\n')
    df = await run(head, "df -B1 --output=avail /tmp")
    header, value = df.stdout.splitlines()
    assert header.strip() == "Avail" and int(value) == world.hosts["spark-a"].state.disk_avail_bytes
    # As GNU df: a missing path is an error line and exit 1; the others keep their rows.
    partly = await run(head, "df -B1 --output=avail /tmp /nonexistent/x")
    assert partly.exit_status == 1
    assert partly.stderr == "df: /nonexistent/x: No such file or directory\n"
    assert [line.strip() for line in partly.stdout.splitlines()] == ["Avail", value]
    posix = await run(head, "df -P /")
    assert posix.stdout.splitlines()[0].split()[:2] == ["Filesystem", "1024-blocks"]
    nosuch = await run(head, "kill -9 999999")
    assert (nosuch.exit_status, nosuch.stderr) == (1, "kill: (999999): No such process\n")
    await world.fault("stray-gpu", "spark-a")
    stray = world.hosts["spark-a"].state.gpu_processes[-1]
    killed = await run(head, f"kill -9 {stray.pid}")
    assert killed.exit_status == 0
    assert stray not in world.hosts["spark-a"].state.gpu_processes


async def test_command_log_records_every_command(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    await run(head, "docker ps -q; systemctl is-active vllm-proxy.service")
    records = world.commands("spark-a")
    assert [r.source for r in records] == ["ssh", "tool", "tool"]
    assert records[0].command == "docker ps -q; systemctl is-active vllm-proxy.service"
    assert [r.command for r in records[1:]] == [
        "docker ps -q",
        "systemctl is-active vllm-proxy.service",
    ]
    assert world.commands("spark-b") == []


async def test_exec_processes_die_with_their_container(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    glm = world.hosts["spark-a"].state.container("glm-flash")
    assert glm is not None
    assert (await run(head, "docker exec -d glm-flash sleep 30")).exit_status == 0
    assert len(glm.real_pids) == 1
    [pid] = glm.real_pids

    async def sleeping() -> bool:
        return _runs_sleep(pid)

    await eventually(sleeping)
    assert (await run(head, "docker rm -f glm-flash")).exit_status == 0

    async def gone() -> bool:
        return not _runs_sleep(pid)

    await eventually(gone)


def _runs_sleep(pid: int) -> bool:
    try:
        return b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
