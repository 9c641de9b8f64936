"""Warm restarts with real vLLM: a relaunch with the same cache entry finds the compile cache
the first launch saved there, an entry of another key (a new image or model) compiles from
scratch.

The entries are named and laid out as sparkd's launch lays them out on a host
(`<model.cache_root>/<core.reading.cache_entries.cache_key>` as VLLM_CACHE_ROOT); there is no
Docker here, so the image IDs are two stand-ins."""

from __future__ import annotations

from pathlib import Path

from sparkd.core.reading import cache_entries
from tests.realvllm.conftest import serving

IMAGE = "sha256:" + "5ac1e0c0ffee" + "0" * 52
NEW_IMAGE = "sha256:" + "b0a710ad0000" + "1" * 52
SAVED = "saved AOT compiled function to "
LOADED = "Directly load AOT compilation from path "
# vLLM logs this only when the artifact exists at the path (compilation/decorators.py). The
# CPU build (mode DYNAMO_TRACE_ONCE, no Inductor) cannot load what it saved, for this reason;
# a GPU build loads it (LOADED). Any other reason is a failure of the cache.
RETRIED = "Compiling model again due to a load failure from "
CPU_BUILD_REASON = "reason: 'function' object has no attribute 'finalize_loading'"


def artifact(log: str, line: str) -> str | None:
    """The artifact path a line of the log names (`.../rank_0_0/model`), or None."""
    for text in log.splitlines():
        _, found, rest = text.partition(line)
        if found:
            return rest.split(",", 1)[0].strip()
    return None


async def launch(model: Path, directory: Path, root: Path, image: str) -> str:
    """One `vllm serve` with the cache entry sparkd would give it, to listening; its log."""
    key = cache_entries.cache_key(image, str(model))
    assert key is not None and cache_entries.ENTRY.fullmatch(key)
    with serving(model, directory, 3, cache=root / key) as server:
        await server.until_listening()
        return server.log.read_text(errors="replace")


async def test_a_relaunch_loads_the_compile_cache_and_a_new_key_starts_clean(
    tiny_model: Path, tmp_path: Path
) -> None:
    root = tmp_path / "cache-root"
    same = cache_entries.cache_key(IMAGE, str(tiny_model))
    other = cache_entries.cache_key(NEW_IMAGE, str(tiny_model))

    cold = await launch(tiny_model, tmp_path / "cold", root, IMAGE)
    saved = artifact(cold, SAVED)
    assert saved is not None and saved.startswith(f"{root / str(same)}/torch_compile_cache/")
    assert artifact(cold, LOADED) is None and artifact(cold, RETRIED) is None

    # The relaunch finds the artifact the first one saved, at the same path.
    warm = await launch(tiny_model, tmp_path / "warm", root, IMAGE)
    loaded, retried = artifact(warm, LOADED), artifact(warm, RETRIED)
    assert saved in (loaded, retried), (loaded, retried)
    if retried is not None:
        assert f"{RETRIED}{saved}, {CPU_BUILD_REASON}" in warm

    # Another image's entry: nothing to find, compiled and saved there.
    fresh = await launch(tiny_model, tmp_path / "fresh", root, NEW_IMAGE)
    new = artifact(fresh, SAVED)
    assert new is not None and new.startswith(f"{root / str(other)}/torch_compile_cache/")
    assert artifact(fresh, LOADED) is None and artifact(fresh, RETRIED) is None
    assert sorted(p.name for p in root.iterdir()) == sorted([str(same), str(other)])
