"""`vllm_warm`: launch to listening of real vLLM 0.32.0 (CPU build, the real-vLLM tier's venv)
serving the tier's tiny model, cold (an empty `VLLM_CACHE_ROOT`), warm (the same cache entry
again, as a restart of the same image and model under `model.cache_dir` does), and with another
image's entry (a new key starts clean): what a persistent compile cache saves a relaunch.
Needs `.venv-vllm` (`make test` builds it); skipped with a line when it is missing."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import free_port, median, table, write_result
from sparkd.core.reading import cache_entries

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SPARKD_VLLM_VENV", ROOT / ".venv-vllm"))
MAKE_MODEL = ROOT / "tests" / "realvllm" / "make_tiny_model.py"
# Two image IDs standing in for the head container's (there is no Docker here).
IMAGES = ("sha256:" + "5ac1e0c0ffee" + "0" * 52, "sha256:" + "b0a710ad0000" + "1" * 52)
ADDRESS = "127.0.98.2"


def listening(port: int) -> bool:
    try:
        with socket.create_connection((ADDRESS, port), 1):
            return True
    except OSError:
        return False


def launch(model: Path, entry: Path, work: Path) -> float:
    """Seconds from `vllm serve` to its port accepting connections; the server is then ended
    with every process of its session."""
    port = free_port(ADDRESS)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-"))
    env = {
        "PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(tmp),
        "VLLM_CACHE_ROOT": str(entry),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [
        str(VENV / "bin" / "vllm"), "serve", str(model), "--host", ADDRESS, "--port", str(port),
        "--reasoning-parser", "qwen3", "--max-model-len", "512",
    ]  # fmt: skip
    with (work / f"serve-{port}.log").open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    started = time.monotonic()
    try:
        while not listening(port):
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited {process.returncode}")
            if time.monotonic() - started > 600:
                raise RuntimeError("vllm serve did not listen within 600 s")
            time.sleep(0.1)
        return time.monotonic() - started
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def measure(runs: int) -> tuple[list[float], list[float], list[float]]:
    with tempfile.TemporaryDirectory(prefix="sparkd-vllm-warm-") as scratch:
        work = Path(scratch)
        model = work / "tiny-qwen3"
        subprocess.run(
            [str(VENV / "bin" / "python"), str(MAKE_MODEL), str(model)],
            check=True,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch, "HF_HUB_OFFLINE": "1"},
        )
        cold: list[float] = []
        warm: list[float] = []
        fresh: list[float] = []
        for run in range(runs):
            # Laid out as sparkd lays out model.cache_dir: one entry per image ID and model.
            root = work / f"cache-{run}"
            entry, other = (cache_entries.cache_key(image, str(model)) for image in IMAGES)
            assert entry is not None and other is not None
            cold.append(launch(model, root / entry, work))
            warm.append(launch(model, root / entry, work))
            fresh.append(launch(model, root / other, work))
    return cold, warm, fresh


def row(what: str, seconds: list[float]) -> tuple[str, str, str]:
    return (what, f"{median(seconds):.1f} s", ", ".join(f"{s:.1f}" for s in seconds))


async def main(quick: bool = False) -> None:
    if not (VENV / "bin" / "vllm").exists():
        print(f"   skipped: no vLLM venv at {VENV} (make test builds it)")
        return
    cold, warm, fresh = await asyncio.to_thread(measure, 1 if quick else 2)
    rows = [
        row("cold (an empty cache entry)", cold),
        row("warm (the same entry again)", warm),
        row("another image's entry (starts clean)", fresh),
    ]
    text = table("vLLM launch to listening", ("start", "median", "runs (s)"), rows)
    print(text)
    result = {"cold_seconds": cold, "warm_seconds": warm, "new_key_seconds": fresh}
    write_result("vllm_warm", result, text)
