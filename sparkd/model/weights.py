"""What the head's file system says of the model directory, read only before a cutover."""

from __future__ import annotations

from pydantic import Field

from sparkd.model.base import Value


class WeightIndex(Value):
    """`model.safetensors.index.json`, parsed: the files its `weight_map` names, and
    `metadata.total_size` (the tensors' bytes) when given."""

    files: tuple[str, ...] = Field(description="the files its `weight_map` names")
    total_size: int | None = Field(None, description="`metadata.total_size`: the tensors' bytes")


class ModelFiles(Value):
    """The head's model directory, read before a cutover."""

    directory: str = Field(
        description="the host's path of the model (the model id through `ray.mounts`)"
    )
    sizes: tuple[tuple[str, int], ...] = Field(
        (),
        description="every file `stat` found there, `[name, bytes]` (config.json, the index, "
        "*.safetensors)",
    )
    stat_error: str | None = Field(
        None,
        description="the read failed other than by absence (a timeout, a permission): what is "
        "there is unknown",
    )
    index: WeightIndex | None = Field(None, description="`model.safetensors.index.json`, parsed")
    index_error: str | None = Field(
        None,
        description="an index that is there but garbled, cut off or unreadable: its file list "
        "is unknown",
    )

    def size(self, name: str) -> int | None:
        return next((size for found, size in self.sizes if found == name), None)
