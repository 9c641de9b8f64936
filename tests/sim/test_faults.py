"""Every fault's observable effect, seen the way sparkd sees it: over SSH and HTTP."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim.control import send_fault, send_query
from sparkd_sim.reference import MODEL_ID
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.sim.steps import HEAD, WORKER, clean_up, serve_command, start_ray
from tests.support.sim import PROBE, connect, eventually, http, refused, run

SERVE_LOG = "serve.log"


async def serving(world: World) -> bool:
    return any(s.phase == "running" for s in world.serves)


@pytest.fixture
async def healthy(tmp_path: Path) -> AsyncIterator[World]:
    async with World(tmp_path / "world", scenario="healthy", timing=Timing.fast()) as w:
        await eventually(lambda: serving(w))
        yield w


async def ssh_refused(world: World, host: str) -> bool:
    try:
        conn = await connect(world, host)
    except OSError as exc:
        return exc.errno == errno.ECONNREFUSED
    conn.close()
    return False


def log_text(world: World) -> str:
    return Path(world.hosts["spark-a"].state.log_dir, SERVE_LOG).read_text()


async def test_healthy_scenario_serves_the_probe(healthy: World) -> None:
    async with await connect(healthy, "spark-a") as head:
        status, body = await http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE)
        assert status == 200
        assert json.loads(body)["usage"]["completion_tokens"] == 50
        ps = await run(head, "docker ps --format '{{.Names}} {{.Label \"sparkd.role\"}}'")
        assert ps.stdout.startswith(f"{HEAD} ")


async def test_reboot(world: World) -> None:
    host = world.hosts["spark-a"]
    old_boot = host.state.boot_id
    async with await connect(world, "spark-a") as head:
        await run(head, "systemctl stop vllm-proxy.service")
        await run(head, "docker rm -f glm-flash")  # removed containers stay removed
        await run(
            head,
            "docker run -d --name keep --restart=unless-stopped --pull=never "
            "hellohal2064/vllm-glm47-gb10 sleep infinity",
        )
        await run(
            head,
            "docker run -d --name once --restart=no --pull=never "
            "hellohal2064/vllm-glm47-gb10 sleep infinity",
        )
    await world.fault("reboot", "spark-a")
    assert await ssh_refused(world, "spark-a")

    async def back() -> bool:
        return not await ssh_refused(world, "spark-a")

    await eventually(back)
    async with await connect(world, "spark-a") as head:
        boot = await run(head, "cat /proc/sys/kernel/random/boot_id")
        assert boot.stdout.strip() not in ("", old_boot)
        units = await run(head, "systemctl is-active vllm-proxy.service vllm-cluster.service")
        assert units.stdout == "active\nactive\n"  # enabled units come back with the boot
        ps = await run(head, "docker ps -a --format '{{.Names}} {{.State}}'")
        assert sorted(ps.stdout.splitlines()) == ["keep running", "once exited"]


async def test_reboot_of_a_worker_kills_the_model(healthy: World) -> None:
    await healthy.fault("reboot", "spark-b")

    async def crashed() -> bool:
        return not await serving(healthy)

    await eventually(crashed)
    assert "EngineDeadError" in log_text(healthy)
    async with await connect(healthy, "spark-a") as head:
        assert await refused(head, "localhost", 30000)


async def test_unreachable_and_heal(world: World) -> None:
    async with await connect(world, "spark-b") as worker:
        await world.fault("unreachable", "spark-b")
        with pytest.raises((asyncssh.Error, OSError)):
            await worker.run("true", timeout=2)
    assert await ssh_refused(world, "spark-b")
    await world.fault("heal", "spark-b")
    async with await connect(world, "spark-b") as worker:
        assert (await run(worker, "true")).exit_status == 0


async def test_blackhole_accepts_and_never_answers(world: World) -> None:
    await world.fault("blackhole", "spark-b")
    h = world.hosts["spark-b"]
    reader, writer = await asyncio.open_connection(h.address, h.port)  # TCP is accepted
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.3)  # but no SSH banner ever comes
    writer.close()
    with pytest.raises((asyncio.TimeoutError, asyncssh.Error)):
        await connect(world, "spark-b", connect_timeout=0.3)
    await world.fault("heal", "spark-b")
    async with await connect(world, "spark-b") as worker:
        assert (await run(worker, "true")).exit_status == 0


async def test_path_lost_silences_ssh_while_the_other_host_still_pings_it(world: World) -> None:
    """`path-lost`: the ops box's SSH to the head goes silent, the head runs on, and the worker's
    ping of its data IP is answered (iputils ping(8): exit 0 on a reply); a `blackhole` (a
    wedge) answers no ping (exit 1)."""
    head_ip = world.hosts["spark-a"].state.data_ip
    await world.fault("path-lost", "spark-a")
    with pytest.raises((asyncio.TimeoutError, asyncssh.Error)):
        await connect(world, "spark-a", connect_timeout=0.3)
    async with await connect(world, "spark-b") as worker:
        answered = await run(worker, f"ping -c 1 -W 2 -n -q {head_ip}")
        assert answered.exit_status == 0, answered.stdout
        assert "1 received" in str(answered.stdout)
    await world.fault("heal", "spark-a")
    await world.fault("blackhole", "spark-a")
    async with await connect(world, "spark-b") as worker:
        lost = await run(worker, f"ping -c 1 -W 2 -n -q {head_ip}")
        assert lost.exit_status == 1 and "0 received" in str(lost.stdout)
    await world.fault("heal", "spark-a")
    async with await connect(world, "spark-a") as head:
        assert (await run(head, "true")).exit_status == 0


async def test_crash_model(healthy: World) -> None:
    await healthy.fault("crash-model", "spark-a")
    assert not await serving(healthy)
    async with await connect(healthy, "spark-a") as head:
        assert await refused(head, "localhost", 30000)
        top = await run(head, f"docker top {HEAD} -eo pid,args")
        assert "vllm serve" not in top.stdout
    assert "EngineDeadError" in log_text(healthy)


async def test_a_long_prompt_runs_with_the_kv_cache_filling_and_no_counter_moving(
    healthy: World,
) -> None:
    from sparkd.shell.model_http import parse_vllm_metrics

    healthy.hosts["spark-a"].behaviour.prefill_rate = 40_000.0  # 5 s
    await healthy.fault("long-prompt", "spark-a", "200000")
    async with await connect(healthy, "spark-a") as head:
        _, before = await http(head, "localhost", 30000, "GET", "/metrics")
        await asyncio.sleep(0.3)
        _, after = await http(head, "localhost", 30000, "GET", "/metrics")
        first, second = parse_vllm_metrics(before), parse_vllm_metrics(after)
        assert second.running == 1
        assert first.generation_tokens == second.generation_tokens is not None
        assert first.prompt_tokens == second.prompt_tokens is not None
        assert first.kv_cache_usage is not None and second.kv_cache_usage is not None
        assert second.kv_cache_usage > first.kv_cache_usage
        # A probe sent meanwhile waits behind the prefill.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE), 0.3
            )
    with pytest.raises(ValueError, match="does not fit"):
        await healthy.fault("long-prompt", "spark-a", "300000")


async def test_hang_under_load_keeps_requests_running_and_the_counter_still(
    healthy: World,
) -> None:
    from sparkd.shell.model_http import parse_vllm_metrics

    await healthy.fault("hang-under-load", "spark-a")
    async with await connect(healthy, "spark-a") as head:
        status, _ = await http(head, "localhost", 30000, "GET", "/health")
        assert status == 200
        _, before = await http(head, "localhost", 30000, "GET", "/metrics")
        await asyncio.sleep(0.3)
        _, after = await http(head, "localhost", 30000, "GET", "/metrics")
        # vLLM's own names and types (tests/fixtures/vllm-real/metrics-busy-4-running.txt).
        assert "# TYPE vllm:num_requests_running gauge" in after
        assert "# TYPE vllm:generation_tokens_total counter" in after
        first, second = parse_vllm_metrics(before), parse_vllm_metrics(after)
        assert second.running is not None and second.running > 0
        assert first.generation_tokens == second.generation_tokens is not None
        # A hung engine makes no step: its KV-cache usage stands too (a prefill's would rise).
        assert first.kv_cache_usage == second.kv_cache_usage is not None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE), 0.3
            )
    # The hang is that serve process's: once it is gone, the host serves as it did.
    healthy._serve_on("spark-a").kill_hard()
    behaviour = healthy.hosts["spark-a"].behaviour

    async def recovered() -> bool:
        return behaviour.engine == "ok"

    await eventually(recovered, within=5)
    assert behaviour.style == "reasoning_only"


async def test_hang_engine_keeps_health_green_but_completions_hang(healthy: World) -> None:
    await healthy.fault("hang-engine", "spark-a")
    async with await connect(healthy, "spark-a") as head:
        status, _ = await http(head, "localhost", 30000, "GET", "/health")
        assert status == 200
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE), 0.3
            )
        await healthy.fault("heal", "spark-a")
        status, _ = await http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE)
        assert status == 200


async def test_answer_style(healthy: World) -> None:
    await healthy.fault("answer-style", "spark-a", "answer")
    async with await connect(healthy, "spark-a") as head:
        _, body = await http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE)
        assert json.loads(body)["choices"][0]["message"]["content"]
    with pytest.raises(ValueError, match="answer-style needs one of"):
        await healthy.fault("answer-style", "spark-a", "poetry")


async def test_oom_during_graph_capture(healthy: World) -> None:
    await healthy.fault("crash-model", "spark-a")
    await healthy.fault("oom-capture", "spark-a")
    async with await connect(healthy, "spark-a") as head:
        assert (await run(head, serve_command(healthy))).exit_status == 0

        # The serve's output reaches the log through the shell's redirection after the process
        # itself ends: wait for its last line in the file too.
        async def exited() -> bool:
            top = (await run(head, f"docker top {HEAD} -eo args")).stdout
            return "vllm serve" not in top and "Failed core proc(s)" in log_text(healthy)

        await eventually(exited)
        assert (await run(head, f"docker inspect -f '{{{{.State.Running}}}}' {HEAD}")).stdout == (
            "true\n"
        )
    relaunch = log_text(healthy).split("vLLM API server version")[-1]
    assert "Capturing CUDA graphs" in relaunch
    lines = relaunch.splitlines()
    assert any("EngineCore failed to start." in line for line in lines)
    assert any("torch.OutOfMemoryError: CUDA out of memory." in line for line in lines)
    assert lines[-1].endswith(
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )
    assert "Application startup complete." not in relaunch


async def test_a_missing_weight_file_fails_the_load_as_vllm_does(healthy: World) -> None:
    await healthy.fault("crash-model", "spark-a")
    await healthy.fault("missing-weights", "spark-a", MODEL_ID)
    async with await connect(healthy, "spark-a") as head:
        for _ in range(2):  # missing until healed: a second load fails the same way
            before = log_text(healthy).count("Failed core proc(s): {}")
            assert (await run(head, serve_command(healthy))).exit_status == 0

            async def exited(before: int = before) -> bool:
                top = (await run(head, f"docker top {HEAD} -eo args")).stdout
                failed = log_text(healthy).count("Failed core proc(s): {}")
                return "vllm serve" not in top and failed == before + 1

            await eventually(exited)
    relaunch = log_text(healthy).split("vLLM API server version")[-1]
    assert "Loading safetensors checkpoint shards" not in relaunch
    assert (
        "FileNotFoundError: Weight files referenced in index but missing: "
        f"{{'{MODEL_ID}/model-00002-of-00039.safetensors'}}"
    ) in relaunch
    assert "EngineCore failed to start." in relaunch


async def stream_open(world: World, host: str, before: int) -> None:
    """Until the `docker events` stream just started on `host` is in the world: it gets there a
    shell or two after its process starts, and an event made before that is not in it."""

    async def there() -> bool:
        return world.hosts[host].engine.subscribed > before

    await eventually(there, within=5)


async def test_kill_container_emits_die_and_restart_policy_applies(world: World) -> None:
    async with await connect(world, "spark-b") as worker:
        before = world.hosts["spark-b"].engine.subscribed
        events = await worker.create_process(
            "timeout 5 docker events --format '{{json .}}' --filter event=die"
        )
        await stream_open(world, "spark-b", before)
        await world.fault("kill-container", "spark-b", "glm-flash")
        event = json.loads(await asyncio.wait_for(events.stdout.readline(), 5))
        events.terminate()
        assert event["Actor"]["Attributes"]["exitCode"] == "137"
        assert event["Actor"]["Attributes"]["name"] == "glm-flash"

        async def restarted() -> bool:
            ps = await run(
                worker, "docker inspect -f '{{.State.Running}} {{.RestartCount}}' glm-flash"
            )
            return ps.stdout == "true 1\n"

        await eventually(restarted)  # restart=always brings it back


async def test_exec_events_carry_the_command_as_docker_does(healthy: World) -> None:
    # `exec_start: CMD` (a filter on `exec_start` matches it, as in Docker), then `exec_die`
    # with the same execID: a watcher can tell its own `docker exec` from the serve process.
    head_name = "sparkd-sparks-ray-head"
    async with await connect(healthy, "spark-a") as head:
        before = healthy.hosts["spark-a"].engine.subscribed
        events = await head.create_process(
            "timeout 5 docker events --format '{{json .}}' "
            "--filter event=exec_start --filter event=exec_die"
        )
        await stream_open(healthy, "spark-a", before)
        await run(head, f"docker exec {head_name} ray status")
        start = json.loads(await asyncio.wait_for(events.stdout.readline(), 5))
        die = json.loads(await asyncio.wait_for(events.stdout.readline(), 5))
        events.terminate()
    assert start["Action"] == start["status"] == "exec_start: ray status"
    assert die["Action"] == "exec_die"
    assert start["Actor"]["Attributes"]["execID"] == die["Actor"]["Attributes"]["execID"]
    assert die["Actor"]["Attributes"]["exitCode"] == "0"


async def test_a_detached_exec_ends_with_exec_die(world: World) -> None:
    async with await connect(world, "spark-a") as head:
        before = world.hosts["spark-a"].engine.subscribed
        events = await head.create_process(
            "timeout 5 docker events --format '{{json .}}' --filter event=exec_die"
        )
        await stream_open(world, "spark-a", before)
        assert (await run(head, "docker exec -d glm-flash sh -c 'exit 3'")).exit_status == 0
        die = json.loads(await asyncio.wait_for(events.stdout.readline(), 5))
        events.terminate()
    assert die["Actor"]["Attributes"]["name"] == "glm-flash"
    assert die["Actor"]["Attributes"]["exitCode"] == "3"


async def test_kill_worker_container_in_a_serving_cluster(healthy: World) -> None:
    await healthy.fault("kill-container", "spark-b", WORKER)
    async with await connect(healthy, "spark-b") as worker:
        ps = await run(worker, f"docker ps -a --filter name={WORKER} --format '{{{{.Status}}}}'")
        assert ps.stdout.startswith("Exited (137)")

    async def crashed() -> bool:
        return not await serving(healthy)

    await eventually(crashed)


async def test_wrong_ip(world: World) -> None:
    await world.fault("wrong-ip", "spark-b")
    wrong = world.hosts["spark-b"].state.ray_ip_override
    assert wrong is not None and wrong.startswith("127.")
    async with await connect(world, "spark-a") as head, await connect(world, "spark-b") as worker:
        await clean_up(world, head, worker)
        await start_ray(world, head, worker)
        nodes = json.loads(
            (await run(head, f"docker exec {HEAD} ray list nodes --format=json")).stdout
        )
        assert {n["node_ip"] for n in nodes} == {world.hosts["spark-a"].address, wrong}


async def test_slow_load(healthy: World) -> None:
    await healthy.fault("crash-model", "spark-a")
    await healthy.fault("slow-load", "spark-a")
    async with await connect(healthy, "spark-a") as head:
        assert (await run(head, serve_command(healthy))).exit_status == 0
        await asyncio.sleep(healthy.timing.model_init + healthy.timing.model_load * 1.5)
        assert await refused(head, "localhost", 30000)  # a normal load would be done by now
        assert healthy.serves and healthy.serves[0].phase == "loading"


async def test_stray_gpu_is_foreign(world: World) -> None:
    await world.fault("stray-gpu", "spark-a", "4096")
    async with await connect(world, "spark-a") as head:
        apps = await run(
            head,
            "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
            "--format=csv,noheader,nounits",
        )
        pid, name, used = apps.stdout.strip().split(", ")
        top = await run(head, "docker top glm-flash -eo pid")
        assert pid not in top.stdout.split()
        assert (name, used) == ("/usr/bin/python3", "4096")
    await world.fault("heal", "spark-a")
    assert all(g.graphics for g in world.hosts["spark-a"].state.gpu_processes)


async def test_faults_through_the_control_socket(world: World) -> None:
    answer = await send_fault(world.control_path, "unreachable", "spark-b", None)
    assert answer["ok"] is True
    assert await ssh_refused(world, "spark-b")
    bad = await send_fault(world.control_path, "melt", "spark-b", None)
    assert bad["ok"] is False and "unknown fault" in bad["message"]
    nohost = await send_fault(world.control_path, "heal", "spark-z", None)
    assert nohost["ok"] is False and "no host" in nohost["message"]
    assert (await send_fault(world.control_path, "heal", "spark-b", None))["ok"] is True
    assert not await ssh_refused(world, "spark-b")


async def test_model_id_in_models_listing(healthy: World) -> None:
    async with await connect(healthy, "spark-a") as head:
        status, body = await http(
            head, healthy.hosts["spark-a"].address, 30000, "GET", "/v1/models"
        )
        assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL_ID


async def test_served_requests_are_queried_through_the_control_socket(healthy: World) -> None:
    address = healthy.hosts["spark-a"].address
    async with await connect(healthy, "spark-a") as head:
        await http(head, address, 30000, "GET", "/health")
        status, _ = await http(head, address, 30000, "POST", "/v1/chat/completions", PROBE)
    served = await send_query(healthy.control_path, "requests", "spark-a")
    last = served[-1]
    assert (last["method"], last["path"], last["status"]) == (
        "POST",
        "/v1/chat/completions",
        status,
    )
    assert served[-2]["path"] == "/health"
    assert 0 < last["seconds"] < 5
    assert await send_query(healthy.control_path, "requests", "spark-b") == []
    commands = await send_query(healthy.control_path, "commands", "spark-a")
    assert any(c["source"] == "tool" and c["command"].startswith("vllm serve") for c in commands)
    with pytest.raises(ValueError, match="unknown query"):
        await send_query(healthy.control_path, "nothing", "spark-a")


async def test_older_vllm_naming_is_a_world_setting(tmp_path: Path) -> None:
    async with World(
        tmp_path / "old", scenario="healthy", answer_naming="reasoning_content"
    ) as world:
        await eventually(lambda: serving(world))
        async with await connect(world, "spark-a") as head:
            _, body = await http(head, "localhost", 30000, "POST", "/v1/chat/completions", PROBE)
        message = json.loads(body)["choices"][0]["message"]
        assert message["content"] is None
        assert message["reasoning_content"] and "reasoning" not in message


async def test_kill_the_serve_pid(healthy: World) -> None:
    async with await connect(healthy, "spark-a") as head:
        top = await run(head, f"docker top {HEAD} -eo pid,etimes,args")
        [row] = [line for line in top.stdout.splitlines() if "vllm serve" in line]
        pid, elapsed = row.split()[:2]
        assert int(elapsed) >= 0
        assert (await run(head, f"kill {pid}")).exit_status == 0

        async def gone() -> bool:
            return await refused(head, "localhost", 30000)

        await eventually(gone)
        assert (await run(head, f"kill {pid}")).exit_status == 1
        apps = await run(head, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
        assert apps.stdout == ""  # its Ray workers released the GPU


async def test_hang_container_stops_its_ray_until_heal(healthy: World) -> None:
    worker = healthy.hosts["spark-b"].state.container(WORKER)
    assert worker is not None and not healthy.ray.frozen(worker.id)
    await healthy.fault("hang-container", "spark-b", WORKER)
    assert healthy.ray.frozen(worker.id)
    await healthy.fault("heal", "spark-b")
    assert not healthy.ray.frozen(worker.id)
    with pytest.raises(ValueError, match="hang-container needs a running container"):
        await healthy.fault("hang-container", "spark-b", "no-such-container")


async def test_missing_weights_removes_the_file_on_the_head_until_heal(healthy: World) -> None:
    shard = healthy.model_dir(MODEL_ID) / "model-00002-of-00039.safetensors"
    await healthy.fault("missing-weights", "spark-a", MODEL_ID)
    async with await connect(healthy, "spark-a") as head:
        seen = await run(head, f"stat -L -c '%s %n' -- {shard}")
        assert seen.exit_status == 1 and "No such file or directory" in seen.stderr
        await healthy.fault("heal", "spark-a")
        seen = await run(head, f"stat -L -c '%s' -- {shard}")
        assert seen.exit_status == 0 and int(seen.stdout) > 1 << 30
