"""Model directories on the simulated hosts, laid out as a Hugging Face checkpoint is: a
`config.json`, `model.safetensors.index.json` (its `weight_map` naming every shard, and
`metadata.total_size`) and the shards, sparse files of plausible sizes (no disk is used)."""

from __future__ import annotations

import json
import os
from pathlib import Path

SHARDS = 39
# A 122B FP8 checkpoint in 39 shards: ~3.2 GB each.
SHARD_BYTES = 3_200_000_000
# A shard is its tensors plus a header (a JSON table of the tensors).
HEADER_BYTES = 40_000


def shard_name(index: int, count: int = SHARDS) -> str:
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def write_checkpoint(directory: Path, shards: int = SHARDS, shard_bytes: int = SHARD_BYTES) -> None:
    """The whole checkpoint at `directory` (made anew: a file removed earlier is back)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weight_map: dict[str, str] = {}
    for index in range(1, shards + 1):
        name = shard_name(index, shards)
        for part in ("self_attn.q_proj.weight", "mlp.experts.0.down_proj.weight"):
            weight_map[f"model.layers.{index - 1}.{part}"] = name
        with (directory / name).open("wb") as shard:
            os.ftruncate(shard.fileno(), shard_bytes)
    total = shards * (shard_bytes - HEADER_BYTES)
    index_text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    (directory / "model.safetensors.index.json").write_text(index_text + "\n")


def missing_files(directory: Path) -> list[str] | None:
    """The files the index names that are not in `directory` (as vLLM's loader finds them);
    None when there is no index to read (nothing to say)."""
    try:
        index = json.loads((directory / "model.safetensors.index.json").read_text())
    except (OSError, ValueError):
        return None
    names = sorted(set(index.get("weight_map", {}).values()))
    return [n for n in names if not (directory / n).exists()]
