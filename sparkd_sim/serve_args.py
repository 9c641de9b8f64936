"""How `vllm serve` reads its command line: the flags vLLM 0.32 takes, and its usage errors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkd_sim.protocol import Done, fail

# vLLM 0.32's top-level usage, as argparse prints it with an error.
TOP_USAGE = (
    "usage: vllm [-h] [-v]\n"
    "            {chat,complete,serve,launch,bench,collect-env,download-kernels,preload,"
    "run-batch,snapshot}\n"
    "            ...\n"
)

_VALUE_FLAGS = {
    "--port",
    "--host",
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--reasoning-parser",
    "--tool-call-parser",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--served-model-name",
    "--api-key",
    "--distributed-executor-backend",
    "--max-num-seqs",
    "--kv-cache-dtype",
    "--dtype",
    "--quantization",
    "--download-dir",
    "--load-format",
    "--safetensors-load-strategy",
    "--model-loader-extra-config",
    "--max-num-batched-tokens",
    "--uvicorn-log-level",
    "--swap-space",
    "--block-size",
    "--seed",
    "--chat-template",
    "--limit-mm-per-prompt",
    "--mm-encoder-tp-mode",
    "--compilation-config",
    "--speculative-config",
    "--data-parallel-size",
    "--tokenizer",
    "--revision",
}
_BOOL_FLAGS = {
    "--enable-auto-tool-choice",
    "--trust-remote-code",
    "--enforce-eager",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
    "--disable-log-requests",
    "--disable-log-stats",
    "--async-scheduling",
    "--enable-expert-parallel",
}


@dataclass
class ServeArgs:
    model: str
    port: int = 8000
    host: str | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    served_name: str | None = None
    api_key: str | None = None
    max_model_len: int = 262144
    # How the weights are read (`--load-format`, `--safetensors-load-strategy`, and
    # `--model-loader-extra-config '{"enable_multithread_load": true}'`): each loader prints its
    # own progress line.
    load_format: str = "auto"
    load_strategy: str | None = None
    multithread: bool = False
    disable_log_stats: bool = False
    argv: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


def _multithread(value: str) -> bool:
    try:
        config = json.loads(value)
    except ValueError:
        return False
    return isinstance(config, dict) and config.get("enable_multithread_load") is True


def parse_serve(args: list[str], env_api_key: str) -> ServeArgs | Done:
    usage = "usage: vllm serve [model_tag] [options]\n"
    if not args or args[0].startswith("-"):
        return fail(usage + "vllm serve: error: the following arguments are required: model_tag", 2)
    parsed = ServeArgs(model=args[0], api_key=env_api_key or None, argv=list(args))
    unknown: list[str] = []
    i = 1
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in _VALUE_FLAGS:
            if not eq:
                i += 1
                if i >= len(args):
                    return fail(
                        usage + f"vllm serve: error: argument {name}: expected one argument", 2
                    )
                value = args[i]
            try:
                if name == "--port":
                    parsed.port = int(value)
                elif name in ("--tensor-parallel-size", "-tp"):
                    parsed.tensor_parallel = int(value)
                elif name in ("--pipeline-parallel-size", "-pp"):
                    parsed.pipeline_parallel = int(value)
                elif name == "--max-model-len":
                    parsed.max_model_len = int(value)
            except ValueError:
                return fail(
                    usage + f"vllm serve: error: argument {name}: invalid int value: '{value}'", 2
                )
            if name == "--served-model-name":
                parsed.served_name = value
            elif name == "--api-key":
                parsed.api_key = value
            elif name == "--host":
                parsed.host = value
            elif name == "--load-format":
                parsed.load_format = value.lower()
            elif name == "--safetensors-load-strategy":
                parsed.load_strategy = value
            elif name == "--model-loader-extra-config":
                parsed.multithread = _multithread(value)
        elif name == "--disable-log-stats":
            parsed.disable_log_stats = True
        elif name not in _BOOL_FLAGS:
            unknown.append(args[i])
        i += 1
    if unknown:
        # The serve subparser only collects them; the top-level `vllm` parser reports them, with
        # its own usage (tests/fixtures/vllm-real/serve-unknown-argument.txt).
        return fail(TOP_USAGE + "vllm: error: unrecognized arguments: " + " ".join(unknown), 2)
    return parsed
