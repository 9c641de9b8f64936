"""What the head's file system says of the model directory, read only before a cutover."""

from __future__ import annotations

from sparkd.model.base import Value


class WeightIndex(Value):
    """`model.safetensors.index.json`, parsed: the files its `weight_map` names, and
    `metadata.total_size` (the tensors' bytes) when given."""

    files: tuple[str, ...]
    total_size: int | None = None


class ModelFiles(Value):
    """`directory` is the host's path of the model (the model id through `ray.mounts`)."""

    directory: str
    # Every file `stat` found there, by name, in bytes (config.json, the index, *.safetensors).
    sizes: tuple[tuple[str, int], ...] = ()
    # The read failed other than by absence (a timeout, a permission): what is there is unknown.
    stat_error: str | None = None
    index: WeightIndex | None = None
    # An index that is there but garbled, cut off or unreadable: its file list is unknown.
    index_error: str | None = None

    def size(self, name: str) -> int | None:
        return next((size for found, size in self.sizes if found == name), None)
