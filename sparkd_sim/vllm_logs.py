"""Lines real vLLM (and the Ray it runs on) print while a model loads: harmless warnings that
contain error-like words while the process keeps running, the periodic heartbeat of a stuck
engine, and what a fatal start-up failure looks like before the process exits."""

from __future__ import annotations

import time

_SITE = "/usr/local/lib/python3.12/dist-packages"


def _stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def ulimit_warning(pid: int) -> str:
    """vLLM raises the fd limit at start-up and warns when it cannot (harmless)."""
    return (
        f"(APIServer pid={pid}) WARNING {_stamp()} [system_utils.py:153] Found ulimit of 1024 and "
        "failed to automatically increase with error current limit exceeds maximum limit. This "
        "can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider "
        "increasing with ulimit -n"
    )


def autoscaler_notice(seconds: int, gpus: int) -> list[str]:
    """Ray's autoscaler notice while a placement group waits for GPUs (harmless: the group is
    placed as soon as the nodes' GPUs show up)."""
    bundle = "{'GPU': 1.0}" if gpus <= 1 else f"{{'GPU': 1.0}} * {gpus}"
    return [
        f"(autoscaler +{seconds}s) Tip: use `ray status` to view detailed cluster status. To "
        "disable these messages, set RAY_SCHEDULER_EVENTS=0.",
        f"(autoscaler +{seconds}s) Error: No available node types can fulfill resource request "
        f"{bundle}. Add suitable node types to this cluster to resolve this issue.",
    ]


def python_warning(pid: int, ip: str | None = None) -> list[str]:
    """A Python warning from a Ray worker whose text names a RuntimeError (harmless)."""
    return [
        f"{ray_prefix(pid, ip)}{_SITE}/torch/cuda/__init__.py:789: UserWarning: "
        "Can't initialize NVML (RuntimeError: NVML_ERROR_NOT_SUPPORTED); memory statistics fall "
        "back to the CUDA runtime",
        f"{ray_prefix(pid, ip)}  warnings.warn(",
    ]


def shm_broadcast_wait(pid: int, seconds: int) -> str:
    """What a vLLM engine prints, again and again, while its workers do not answer."""
    return (
        f"(EngineCore_DP0 pid={pid}) WARNING {_stamp()} [shm_broadcast.py:466] No available "
        f"shared memory broadcast block found in {seconds} seconds. This typically happens when "
        "some processes are hanging or doing some time-consuming work (e.g. compilation, "
        "weight/kv cache quantization)."
    )


def compile_lines(pid: int) -> list[str]:
    """torch.compile before the graph capture: long, quiet, CPU-bound."""
    return [
        f"(EngineCore_DP0 pid={pid}) INFO {_stamp()} [backends.py:548] Using cache directory: "
        "/root/.cache/vllm/torch_compile_cache/5c3d1f0a2b/rank_0_0/backbone for vLLM's "
        "torch.compile",
        f"(EngineCore_DP0 pid={pid}) INFO {_stamp()} [backends.py:559] Dynamo bytecode transform "
        "time: 21.37 s",
    ]


def engine_failed(
    api_pid: int,
    core_pid: int,
    root_cause: list[str],
    step: tuple[int, str] = (92, "self._initialize_kv_caches(vllm_config)"),
) -> list[str]:
    """A fatal start-up failure: the engine core's traceback (ending in `root_cause`, raised
    under `step` of EngineCore.__init__), then the API server's `Engine core initialization
    failed`; the process exits 1 after it."""
    core = f"(EngineCore_DP0 pid={core_pid}) ERROR {_stamp()} [core.py:708]"
    api = f"(APIServer pid={api_pid})"
    return [
        f"{core} EngineCore failed to start.",
        f"{core} Traceback (most recent call last):",
        f'{core}   File "{_SITE}/vllm/v1/engine/core.py", line 699, in run_engine_core',
        f"{core}     engine_core = EngineCoreProc(*args, **kwargs)",
        f'{core}   File "{_SITE}/vllm/v1/engine/core.py", line 498, in __init__',
        f"{core}     super().__init__(vllm_config, executor_class, log_stats,",
        f'{core}   File "{_SITE}/vllm/v1/engine/core.py", line {step[0]}, in __init__',
        f"{core}     {step[1]}",
        *(f"{core} {line}" for line in root_cause),
        "Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        *root_cause,
        f"{api} Traceback (most recent call last):",
        f'{api}   File "/usr/local/bin/vllm", line 10, in <module>',
        f"{api}     sys.exit(main())",
        f'{api}   File "{_SITE}/vllm/v1/engine/utils.py", line 880, in wait_for_engine_startup',
        f'{api}     raise RuntimeError("Engine core initialization failed. "',
        f"{api} RuntimeError: Engine core initialization failed. See root cause above. Failed "
        "core proc(s): {}",
    ]


def cuda_oom(during: str) -> list[str]:
    """The root cause of an OOM while capturing CUDA graphs (or profiling)."""
    return [
        f'  File "{_SITE}/vllm/v1/worker/gpu_model_runner.py", line 3480, in {during}',
        "    self._dummy_run(num_tokens, cudagraph_runtime_mode=mode)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 119.70 GiB of which 1.23 GiB is free. Including non-PyTorch memory, "
        "this process has 110.12 GiB memory in use. Of the allocated memory 104.38 GiB is "
        "allocated by PyTorch, and 3.91 GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]


# Where EngineCore.__init__ builds its executor, which loads the weights.
EXECUTOR_STEP = (144, "self.model_executor = executor_class(vllm_config)")


def missing_weight_files(files: list[str]) -> list[str]:
    """The root cause when the checkpoint's index names a shard that is not there: vLLM 0.32
    checks the index against the files before it loads any (weight_utils.py,
    filter_duplicate_safetensors_files), so no shard-progress line comes first."""
    missing = "{" + ", ".join(repr(f) for f in files) + "}"
    return [
        f'  File "{_SITE}/vllm/model_executor/model_loader/default_loader.py", line 252, in '
        "_prepare_weights",
        "    hf_weights_files = filter_duplicate_safetensors_files(",
        f'  File "{_SITE}/vllm/model_executor/model_loader/weight_utils.py", line 606, in '
        "filter_duplicate_safetensors_files",
        "    raise FileNotFoundError(",
        f"FileNotFoundError: Weight files referenced in index but missing: {missing}",
    ]


def crash_loop_log(pid: int) -> list[str]:
    """A stale GLM server dying at start-up after a reboot (its GPU is not what it expects)."""
    return [
        f"(APIServer pid={pid}) INFO {_stamp()} [api_server.py:1896] vLLM API server version "
        "0.10.1",
        *engine_failed(pid, pid + 1, cuda_oom("profile_run")),
    ]


# Each weight loader's progress bar: its tqdm `desc` (the same `_BAR_FORMAT`, "{desc}:
# {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]") and what it counts. vLLM 0.32.0
# and 0.34.0 `vllm/model_executor/model_loader/weight_utils.py` (0.34.0: 1140-1141, 1287, 1329,
# 1479, 1507, 1538, 904), fastsafetensors 0.3.2 `fastsafetensors/parallel_loader.py` (295, 370);
# tests/fixtures/vllm-loaders. Loaders with no bar (sharded_state, tensorizer, dummy) load in
# silence.
DEFAULT_LOADER = ("Loading safetensors checkpoint shards", "shards")
_LOADERS: dict[str, tuple[str, str] | None] = {
    "auto": DEFAULT_LOADER,
    "safetensors": DEFAULT_LOADER,
    "hf": DEFAULT_LOADER,
    "mistral": DEFAULT_LOADER,
    "fastsafetensors": ("Loading fastsafetensors checkpoint shards", "shards"),
    "instanttensor": ("Loading safetensors using InstantTensor loader", "bytes"),
    "runai_streamer": ("Loading safetensors using Runai Model Streamer", "tensors"),
    "npcache": ("Loading np_cache checkpoint shards", "shards"),
    "pt": ("Loading pt checkpoint shards", "shards"),
    "sharded_state": None,
    "runai_streamer_sharded": None,
    "tensorizer": None,
    "dummy": None,
}


def loader_bar(load_format: str, strategy: str | None, multithread: bool) -> tuple[str, str] | None:
    """The progress bar the loader chosen by these arguments prints, or None for none."""
    bar = _LOADERS.get(load_format, DEFAULT_LOADER)
    if bar is None:
        return None
    if multithread and bar[0] in (DEFAULT_LOADER[0], "Loading pt checkpoint shards"):
        # `--model-loader-extra-config '{"enable_multithread_load": true}'` (default loader).
        pt = bar[0] != DEFAULT_LOADER[0]
        return (
            "Multi-thread loading pt checkpoint shards" if pt else "Multi-thread loading shards"
        ), "shards"
    if strategy == "eager" and bar == DEFAULT_LOADER:
        return f"{DEFAULT_LOADER[0]} (eager)", "shards"
    return bar


def ray_prefix(pid: int, ip: str | None = None) -> str:
    """Ray's prefix on a line an actor printed, as the driver shows it (ray 2.60
    `_private/worker.py` `print_worker_logs`): the node's IP only for a remote actor."""
    return f"(RayWorkerProc pid={pid}{f', ip={ip}' if ip else ''}) "


# A Ray worker's title once loaded: Ray's `ray::<class>.<method>` for the busy loop it runs
# (tests/fixtures/vllm-ray-titles).
RUN_TITLE = "ray::RayWorkerProc.run"


def worker_title(rank: int, tensor_parallel: int, pipeline_parallel: int) -> str:
    """vLLM's title for a worker while it loads (`setup_proc_title_and_log_prefix`: `Worker`,
    then `_PP<rank>` and `_TP<rank>` for each group larger than one)."""
    name = "Worker"
    if pipeline_parallel > 1:
        name += f"_PP{rank // max(tensor_parallel, 1)}"
    if tensor_parallel > 1:
        name += f"_TP{rank % tensor_parallel}"
    return f"VLLM::{name}"


def placement_timeout(specs: list[dict[str, float]]) -> list[str]:
    """The error `_wait_until_pg_ready` raises when the placement group was not ready within
    PG_WAIT_TIMEOUT (1800 s): vLLM 0.32.0 `v1/executor/ray_utils.py`, lines 478-505, its longer
    text for a group of more than one GPU."""
    gpus = sum(spec.get("GPU", 0.0) for spec in specs)
    if gpus > 1:
        return [
            f"ValueError: Cannot provide a placement group requiring {gpus} GPUs "
            f"(placement_group_specs={specs}) within 1800 seconds.",
            "Tensor parallel size may exceed available GPUs in your cluster. Check resources "
            "with `ray status` and `ray list nodes`.",
            "If running on K8s with limited GPUs, consider reducing --tensor-parallel-size to "
            "match available GPU resources.",
        ]
    return [
        f"ValueError: Cannot provide a placement group of placement_group_specs={specs} within "
        "1800 seconds. See `ray status` and `ray list nodes` to make sure the cluster has enough "
        "resources."
    ]
