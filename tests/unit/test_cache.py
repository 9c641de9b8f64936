"""The compile cache: its key, its mount (not part of the spec), and the planner's pruning."""

from __future__ import annotations

import shlex
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging import cache
from sparkd.core.reading import cache_entries, parsers
from sparkd.core.spec import container_name, model_spec_hashes, ray_spec_hash, ray_spec_hashes
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Attempt
from sparkd.model.observed import CacheEntry, HostFacts, Observed
from sparkd.model.plan import Plan
from sparkd.shell import catalogue
from tests.support.forced import decide
from tests.support.planning import served
from tests.toy import Toy, reference_cluster

IMAGE_ID = "sha256:" + "ab12cd34ef56" + "0" * 52
OTHER_ID = "sha256:" + "99aa88bb77cc" + "1" * 52


def with_model(cluster: ClusterSpec, **changes: object) -> ClusterSpec:
    return cluster.model_copy(update={"model": cluster.model.model_copy(update=changes)})


# -- the spec: an upgrade restarts nothing ---------------------------------------------------


def test_spec_hashes_are_what_they_were_before_the_cache_mount() -> None:
    """The labels of containers created before the cache mount existed (these values) are
    still "as desired": nothing is restarted by an upgrade, whatever the cache settings."""
    cluster = reference_cluster()
    before = {"spark-a": "8f1737890491", "spark-b": "e071a25225f3"}
    for other in (cluster, with_model(cluster, cache_dir=Path("/srv/vllm-cache"), cache_keep=5)):
        for host in other.hosts:
            assert ray_spec_hash(other, host) == before[host.name]
            assert before[host.name] in ray_spec_hashes(other, host)
        assert "419b0b9e5ef2" in model_spec_hashes(other)


def test_a_container_without_the_mount_is_not_drift() -> None:
    toy = Toy.healthy(with_model(reference_cluster(), cache_dir=Path("/srv/vllm-cache")))
    memory = served(toy)
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert result.phase == "healthy"
    assert result.actions == ()


def test_every_container_mounts_the_cache_at_its_own_path() -> None:
    cluster = with_model(reference_cluster(), cache_dir=Path("/srv/vllm cache"))
    for host in cluster.hosts:
        argv = catalogue.actions.docker_run_argv(cluster, host)
        assert "/srv/vllm cache:/srv/vllm cache" in argv
        assert shlex.split(catalogue.actions.start_ray(cluster, host, 30).command).count(
            "mkdir"
        ) == (2 if host.role == "head" else 1)
    default = reference_cluster()
    assert default.model.cache_root == default.model.log_dir / "cache"


# -- the key --------------------------------------------------------------------------------


def test_key_names_image_and_model() -> None:
    assert cache_entries.cache_key(IMAGE_ID, "Qwen/Qwen3-8B") == "ab12cd34ef56-Qwen--Qwen3-8B"
    assert (
        cache_entries.cache_key(IMAGE_ID, "/models/Qwen3.5-122B")
        == "ab12cd34ef56-models--Qwen3.5-122B"
    )
    assert cache_entries.cache_key("not an id", "m") is None
    assert cache_entries.cache_key(OTHER_ID, "m") != cache_entries.cache_key(IMAGE_ID, "m")


@given(st.text(max_size=300))
def test_every_key_is_one_entry_of_sparkds_naming(model_id: str) -> None:
    key = cache_entries.cache_key(IMAGE_ID, model_id)
    assert key is not None and cache_entries.ENTRY.fullmatch(key)
    cluster = reference_cluster()
    words = shlex.split(catalogue.actions.prune_cache(cluster, cluster.head, key, 30).command)
    target = str(cluster.model.cache_root / key)
    assert words[4:] == [
        "docker",
        "exec",
        container_name(cluster, cluster.head),
        "rm",
        "-rf",
        "--",
        target,
    ]


def test_prune_refuses_what_is_not_an_entry() -> None:
    for name in ("..", ".", "a/b", "../../etc", "serve.log", "ab12cd34ef56-../x"):
        try:
            catalogue.actions.prune_cache(reference_cluster(), reference_cluster().head, name, 30)
        except ValueError:
            continue
        raise AssertionError(name)


def test_df_of_log_dir_and_cache() -> None:
    paths = ["/var/lib/sparkd-serve", "/var/lib/sparkd-serve/cache"]
    both = "      Avail\n77586223104\n12\n"
    assert parsers.parse_df_paths(both, paths) == dict(zip(paths, [77586223104, 12], strict=True))
    # Real df for a missing path: the error line (stderr, merged), rows for the others, exit 1.
    missing = f"df: {paths[1]}: No such file or directory\n      Avail\n77586223104\n"
    assert parsers.parse_df_paths(missing, paths) == {paths[0]: 77586223104, paths[1]: None}
    # In another language, and the log_dir missing while the cache (a longer path) is there.
    german = f"df: {paths[0]}: Datei oder Verzeichnis nicht gefunden\n     Verf.\n99\n"
    assert parsers.parse_df_paths(german, paths) == {paths[0]: None, paths[1]: 99}
    assert parsers.parse_df_paths("garbage\n", paths) == dict.fromkeys(paths)


def test_listing_parses_find_printf() -> None:
    text = "1796000000.1234567890 ab12cd34ef56-m\n1796000100.5 other\nbroken\n"
    assert cache_entries.parse_listing(text) == (
        CacheEntry(name="ab12cd34ef56-m", mtime=1796000000.1234567890),
        CacheEntry(name="other", mtime=1796000100.5),
    )


# -- pruning --------------------------------------------------------------------------------


def with_cache(
    toy: Toy, entries: dict[str, list[CacheEntry]], free: int = 1 << 40, image_id: str = IMAGE_ID
) -> Observed:
    observed = toy.observe()
    cluster = toy.cluster
    hosts = []
    for seen in observed.hosts:
        name = container_name(cluster, cluster.host(seen.name))
        containers = tuple(
            c.model_copy(update={"image_id": image_id}) if c.name == name else c
            for c in seen.containers
        )
        hosts.append(
            seen.model_copy(
                update={
                    "containers": containers,
                    "cache_entries": tuple(entries.get(seen.name, [])),
                    "cache_free_bytes": free,
                }
            )
        )
    return observed.model_copy(update={"hosts": tuple(hosts)})


def entry(name: str, age: float) -> CacheEntry:
    return CacheEntry(name=name, mtime=1_700_000_000 - age)


def key(toy: Toy) -> str:
    found = cache_entries.cache_key(IMAGE_ID, toy.cluster.model.id)
    assert found is not None
    return found


def pruned(result: Plan) -> list[tuple[str, str]]:
    return [(a.host, a.target) for a in result.actions if a.kind == "prune_cache"]


def test_healthy_cluster_prunes_old_entries_but_never_the_one_in_use() -> None:
    toy = Toy.healthy()
    now = key(toy)
    old = [f"{n:012x}-old" for n in range(1, 4)]
    entries = {
        "spark-a": [entry(now, 9999), entry(old[0], 10), entry(old[1], 20), entry("notes", 1)],
        "spark-b": [entry(old[2], 5)],
    }
    result = plan(toy.cluster, with_cache(toy, entries), served(toy), toy.now)
    assert result.phase == "healthy"
    # Two kept per host: the one in use (oldest by time, yet kept) and the newest other.
    assert pruned(result) == [("spark-a", old[1])]
    assert "pruning 1 old compile cache entries" in result.reason
    assert now in result.actions[0].reason


def test_low_space_keeps_only_the_entry_in_use() -> None:
    toy = Toy.healthy()
    now = key(toy)
    entries = {"spark-a": [entry(now, 50), entry("0000000000aa-x", 10)]}
    result = plan(toy.cluster, with_cache(toy, entries, free=1024), served(toy), toy.now)
    assert pruned(result) == [("spark-a", "0000000000aa-x")]
    assert "below min_disk_free" in result.actions[0].reason


def test_nothing_pruned_while_not_healthy_or_in_use_unknown() -> None:
    toy = Toy.healthy()
    entries = {"spark-a": [entry(f"{n:012x}-old", n) for n in range(1, 6)]}
    unknown = with_cache(toy, entries, image_id="")
    assert pruned(plan(toy.cluster, unknown, served(toy), toy.now)) == []
    toy.unreachable("spark-b")
    assert pruned(plan(toy.cluster, with_cache(toy, entries), served(toy), toy.now)) == []


def test_a_prune_that_keeps_failing_never_blocks_the_cluster() -> None:
    toy = Toy.healthy()
    entries = {
        "spark-a": [entry(key(toy), 1), entry("0000000000aa-x", 5), entry("0000000000bb-y", 9)]
    }
    observed = with_cache(toy, entries)
    first = plan(toy.cluster, observed, served(toy), toy.now)
    action = first.actions[0]
    attempts = tuple(
        Attempt(key=action.key, at=toy.now - 10 + i, ok=True, reason=action.reason)
        for i in range(9)
    )
    memory = served(toy).model_copy(update={"attempts": attempts})
    later = plan(toy.cluster, observed, memory, toy.now)
    assert later.phase == "healthy" and later.latch is None
    assert action in later.withheld


NAMES = st.from_regex(r"[0-9a-f]{12}-[a-z]{1,6}", fullmatch=True) | st.sampled_from(
    ["notes", "..", "tmp.x"]
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["spark-a", "spark-b"]),
        st.lists(st.tuples(NAMES, st.floats(0, 1e6)), max_size=12),
    ),
    st.booleans(),
    st.integers(1, 4),
    st.booleans(),
)
def test_property_pruning_is_bounded_and_spares_the_entry_in_use(
    raw: dict[str, list[tuple[str, float]]], use_present: bool, keep: int, tight: bool
) -> None:
    toy = Toy.healthy(with_model(reference_cluster(), cache_keep=keep))
    now = key(toy)
    entries = {h: [entry(n, age) for n, age in rows] for h, rows in raw.items()}
    if use_present:
        entries.setdefault("spark-a", []).append(entry(now, 1e7))
    free = 1024 if tight else 1 << 40
    result = plan(toy.cluster, with_cache(toy, entries, free=free), served(toy), toy.now)
    for host, target in pruned(result):
        assert target != now
        assert cache_entries.ENTRY.fullmatch(target)
        assert target in {e.name for e in entries[host]}
    for host, rows in entries.items():
        ours = {e.name for e in rows if cache_entries.ENTRY.fullmatch(e.name) and e.name != now}
        gone = {t for h, t in pruned(result) if h == host}
        assert len(gone) <= cache.PRUNE_PER_PLAN
        if len(gone) < cache.PRUNE_PER_PLAN:
            assert len(ours - gone) == min(len(ours), (1 if tight else keep) - 1)
    assert result.phase == "healthy"


def test_facts_without_the_cache_read_are_unknown_not_empty() -> None:
    assert HostFacts(name="x").cache_entries is None


def test_the_forced_command_lets_through_prunes_of_sparkds_entries_only() -> None:
    cluster = reference_cluster()
    seconds = cluster.ssh.command_timeout
    for host in cluster.hosts:
        allowed = decide(cluster, host)
        key = cache_entries.cache_key(OTHER_ID, "Qwen/Qwen3-8B")
        assert key is not None
        assert allowed(catalogue.actions.prune_cache(cluster, host, key, seconds).command)
        good = catalogue.actions.prune_cache(cluster, host, "0123456789ab-model", seconds).command
        for bad in ("..", "0123456789ab-x/../../etc", "notes", "0123456789ab-model -r /"):
            assert not allowed(good.replace("0123456789ab-model", bad)), bad
