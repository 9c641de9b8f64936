"""Facts of the reference deployment the world recreates (from the seeds): images, the model,
the data-plane interface and the stale units that came back with the reboot."""

from __future__ import annotations

QWEN_IMAGE = "hellohal2064/vllm-qwen3.5-gb10"
GLM_IMAGE = "hellohal2064/vllm-glm47-gb10:latest"
MODEL_ID = "/models/Qwen3.5-122B-A10B-FP8"
INTERFACE = "enp1s0f0np0"
MANAGEMENT_INTERFACE = "enP7s7"
STALE_UNITS = (
    "vllm-cluster.service",
    "vllm-proxy.service",
    "vllm-embeddings.service",
    "vllm-reranker.service",
)
