"""Prepare before cutover: the model's files on the head, parsed totally, and the planner never
stopping or launching anything for a checkpoint that is not whole (or not known to be)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding import rollout
from sparkd.core.judging import weights
from sparkd.core.reading import weight_files
from sparkd.core.reading.assemble import _model_files
from sparkd.core.reading.parsers import parse_sections
from sparkd.core.spec import identity
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import Observed
from sparkd.model.plan import MODEL_STARTS, STOPS
from sparkd.model.weights import ModelFiles, WeightIndex
from sparkd.shell import catalogue, ssh
from sparkd.shell.catalogue.reads import _SECTION_FUNCTION
from tests.support.toy_run import Run, serving
from tests.toy import Toy, reference_cluster

SHARDS = tuple(f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5))
DIR = "/models/Qwen3.5-122B-A10B-FP8"
WHOLE = WeightIndex(files=SHARDS, total_size=4000)


def index_text(total: object = 4000, files: tuple[str, ...] = SHARDS) -> str:
    weight_map = {f"model.layers.{i}.mlp.weight": name for i, name in enumerate(files)}
    return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})


def files(
    present: tuple[str, ...] = SHARDS,
    size: int = 1100,
    index: WeightIndex | None = WHOLE,
    index_error: str | None = None,
    config: bool = True,
) -> ModelFiles:
    sizes = [(name, size) for name in present]
    if config:
        sizes.append(("config.json", 900))
    if index is not None or index_error is not None:
        sizes.append((weight_files.INDEX, 5000))
    return ModelFiles(directory=DIR, sizes=tuple(sizes), index=index, index_error=index_error)


# -- the parsers ---------------------------------------------------------------------------


def test_stat_lines_give_sizes_and_an_absent_file_is_only_absent() -> None:
    text = (
        f"900 {DIR}/config.json\n"
        f"5000 {DIR}/model.safetensors.index.json\n"
        f"stat: cannot statx '{DIR}/model-00002-of-00004.safetensors': No such file or directory\n"
        f"1100 {DIR}/model-00001-of-00004.safetensors\n"
    )
    read = weight_files.parse_stat(DIR, text, 1)
    assert read.stat_error is None
    assert read.size("config.json") == 900 and read.size(SHARDS[0]) == 1100
    assert read.size(SHARDS[1]) is None


def test_a_stat_that_timed_out_or_was_refused_is_unknown() -> None:
    assert weight_files.parse_stat(DIR, "", 124).stat_error == "stat exited 124"
    assert (
        weight_files.parse_stat(DIR, "partial", None).stat_error == "stat exited without a status"
    )
    denied = f"stat: cannot statx '{DIR}/config.json': Permission denied"
    assert weight_files.parse_stat(DIR, denied, 1).stat_error == denied


def test_an_index_parses_to_its_files_and_total_size() -> None:
    parsed = weight_files.parse_index(index_text())
    assert parsed == WeightIndex(files=SHARDS, total_size=4000)
    # Some writers store the size as a float.
    assert weight_files.parse_index(index_text(total=4000.0)) == parsed
    no_meta = json.dumps({"weight_map": {"a": SHARDS[0]}})
    assert weight_files.parse_index(no_meta) == WeightIndex(files=(SHARDS[0],))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (index_text()[:-40], "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        (json.dumps({"metadata": {}}), "has no weight_map"),
        (json.dumps({"weight_map": {}}), "has no weight_map"),
        (index_text(files=("../escape.safetensors",)), "not a file in the model directory"),
        (index_text(files=("/etc/passwd",)), "not a file in the model directory"),
        (json.dumps({"weight_map": {"a": 3}}), "not a file in the model directory"),
        (index_text(total="4000"), "has total_size '4000'"),
        (index_text(total=-1), "has total_size -1"),
        (index_text(total=True), "has total_size True"),
        (index_text(total=1.5), "has total_size 1.5"),
        ("x" * (weight_files.INDEX_LIMIT + 1), "is larger than"),
    ],
)
def test_a_garbled_index_is_unknown_with_why(text: str, why: str) -> None:
    parsed = weight_files.parse_index(text)
    assert isinstance(parsed, str) and why in parsed


@given(st.text(max_size=300))
def test_the_index_parser_is_total(text: str) -> None:
    parsed = weight_files.parse_index(text)
    assert isinstance(parsed, WeightIndex | str)


def test_host_path_follows_the_mount_that_holds_the_model() -> None:
    cluster = reference_cluster()

    def with_(model: str, mounts: tuple[str, ...]) -> ClusterSpec:
        ray = cluster.ray.model_copy(update={"mounts": mounts})
        spec = cluster.model.model_copy(update={"id": model})
        return cluster.model_copy(update={"ray": ray, "model": spec})

    assert weight_files.host_path(with_("/models/q", ("/data/m:/models",))) == "/data/m/q"
    nested = ("/data:/models", "/fast/q:/models/q:ro")
    assert weight_files.host_path(with_("/models/q/", nested)) == "/fast/q"
    assert weight_files.host_path(with_("/models", ("/data:/models",))) == "/data"
    assert weight_files.host_path(with_("/modelsx/q", ("/data:/models",))) is None
    assert weight_files.host_path(with_("Qwen/Qwen3-8B", ("/data:/models",))) is None


# -- what blocks a cutover -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "why"),
    [
        (files(present=SHARDS[:1] + SHARDS[2:]), f"weight file {SHARDS[1]} named by its index"),
        (files(present=()), f"{SHARDS[0]}, {SHARDS[1]}, {SHARDS[2]} and 1 more"),
        (files(config=False), f"{DIR}/config.json is missing"),
        (files(index=None, index_error="not JSON"), "model.safetensors.index.json is unknown"),
        (files(size=999), "hold 3996 bytes, below the index's total_size 4000"),
        (files(size=0), f"weight file {SHARDS[0]} in {DIR} is empty"),
        (files(present=(), index=None), "weight file model.safetensors missing"),
        (ModelFiles(directory=DIR, stat_error="stat exited 124"), "is unknown: stat exited 124"),
    ],
)
def test_an_unready_checkpoint_names_the_file_or_the_shortfall(read: ModelFiles, why: str) -> None:
    found = weights.unready(read)
    assert found is not None and why in found, found


def test_a_whole_checkpoint_is_ready() -> None:
    assert weights.unready(files()) is None
    assert weights.unready(files(index=WeightIndex(files=SHARDS))) is None
    assert weights.unready(files(present=("model.safetensors",), index=None)) is None


# -- the fact script's sections, run by a real shell on real files -------------------------


def run_sections(cluster: ClusterSpec, tmp: Path) -> ModelFiles | None:
    directory = weight_files.host_path(cluster)
    assert directory is not None
    script = "\n".join([_SECTION_FUNCTION, *catalogue.reads.model_files_sections(directory, 10)])
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    return _model_files(cluster, parse_sections(out.stdout))


def at(tmp: Path) -> ClusterSpec:
    cluster = reference_cluster()
    ray = cluster.ray.model_copy(update={"mounts": (f"{tmp}/my models:/models",)})
    return cluster.model_copy(update={"ray": ray})


def test_the_sections_read_a_real_model_directory(tmp_path: Path) -> None:
    cluster = at(tmp_path)
    model = Path(weight_files.host_path(cluster) or "")
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / weight_files.INDEX).write_text(index_text(total=2000))
    for name in SHARDS[:1] + SHARDS[2:]:
        with (model / name).open("wb") as shard:
            shard.truncate(1000)
    read = run_sections(cluster, tmp_path)
    assert read is not None and read.index == WeightIndex(files=SHARDS, total_size=2000)
    assert weights.unready(read) == f"weight file {SHARDS[1]} named by its index missing in {model}"
    (model / SHARDS[1]).write_bytes(b"\0" * 1000)
    read = run_sections(cluster, tmp_path)
    assert read is not None and weights.unready(read) is None


def big_moe_index(total: int) -> str:
    """An index of a big MoE FP8 checkpoint (~10 MB): a scale for every expert weight."""
    weight_map = {
        f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight_scale_inv": SHARDS[layer % 4]
        for layer in range(94)
        for expert in range(256)
        for proj in ("gate_proj", "up_proj", "down_proj", "gate_up_proj_bias")
    }
    return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)


def test_a_big_index_is_reduced_on_the_host_well_inside_the_output_bound(tmp_path: Path) -> None:
    cluster = at(tmp_path)
    model = Path(weight_files.host_path(cluster) or "")
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    text = big_moe_index(total=4000)
    assert ssh.MAX_OUTPUT < len(text) < weight_files.INDEX_LIMIT
    (model / weight_files.INDEX).write_text(text)
    for name in SHARDS:
        (model / name).write_bytes(b"\0" * 1000)
    directory = weight_files.host_path(cluster)
    assert directory is not None
    script = "\n".join([_SECTION_FUNCTION, *catalogue.reads.model_files_sections(directory, 30)])
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=False).stdout
    assert len(out) < ssh.MAX_OUTPUT // 8
    read = _model_files(cluster, parse_sections(out.decode()))
    assert read is not None and read.index == WeightIndex(files=SHARDS, total_size=4000)
    assert weights.unready(read) is None


def test_an_index_the_host_cannot_reduce_is_unknown_with_why(tmp_path: Path) -> None:
    cluster = at(tmp_path)
    model = Path(weight_files.host_path(cluster) or "")
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    index = model / weight_files.INDEX
    for text, why in (
        (index_text()[:-40], "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        (" " * weight_files.INDEX_LIMIT + "{}", f"larger than {weight_files.INDEX_LIMIT} bytes"),
    ):
        index.write_text(text)
        read = run_sections(cluster, tmp_path)
        assert read is not None and read.index is None
        assert read.index_error is not None and why in read.index_error, read.index_error
        assert f"{weight_files.INDEX} is unknown: " in (weights.unready(read) or "")


def test_the_sections_read_an_absent_directory_as_missing(tmp_path: Path) -> None:
    cluster = at(tmp_path)
    read = run_sections(cluster, tmp_path)
    assert read is not None and read.stat_error is None
    assert weights.unready(read) == f"{weight_files.host_path(cluster)}/config.json is missing"


def test_only_the_heads_script_reads_the_model_and_only_while_preparing() -> None:
    cluster = reference_cluster()
    head, worker = cluster.head, cluster.workers[0]
    assert "model_files" not in catalogue.reads.fact_script(cluster, head, 10).command
    assert "model_files" in catalogue.reads.fact_script(cluster, head, 10, prepare=True).command
    assert (
        "model_files" not in catalogue.reads.fact_script(cluster, worker, 10, prepare=True).command
    )


# -- the planner ---------------------------------------------------------------------------


def with_files(run: Run, read: ModelFiles | None) -> None:
    """The toy's head reports `read` for the model directory from now on."""
    toy = run.toy
    base = Toy.observe

    def observe() -> Observed:
        seen = base(toy)
        head = toy.cluster.head.name
        hosts = tuple(
            h.model_copy(update={"model_files": read}) if h.name == head else h for h in seen.hosts
        )
        return seen.model_copy(update={"hosts": hosts})

    object.__setattr__(toy, "observe", observe)


def moved(cluster: ClusterSpec, model: str = "/models/Qwen3.5-122B-A10B-FP8-v2") -> ClusterSpec:
    return cluster.model_copy(update={"model": cluster.model.model_copy(update={"id": model})})


def test_a_change_with_a_missing_weight_file_stops_nothing_until_it_appears() -> None:
    run = serving()
    old = run.toy.serve_spec
    missing = files(present=SHARDS[:1] + SHARDS[2:])
    with_files(run, missing)
    run.desired = moved(run.desired)
    for _ in range(3):
        made = run.cycle()
        assert made.phase == "blocked" and not made.actions, made.reason
        want = identity(run.desired)
        assert made.reason.startswith(f"rollout of {want} waits: weight file {SHARDS[1]}")
        assert run.toy.serve_spec == old and run.memory.blocked is None
    with_files(run, files())
    cut = run.cycle()
    assert [a.kind for a in cut.actions] == ["restart_model"]
    run.until("healthy")
    for _ in range(4):
        run.cycle()
    record = run.memory.rollout
    assert record is not None and record.result == "accepted"
    starts = [a for p in run.plans for a in p.actions if a.kind.endswith("model")]
    assert len(starts) == 1


def test_an_unknown_index_holds_the_cutover_but_not_the_serving_cluster() -> None:
    run = serving()
    with_files(run, files(index=None, index_error="is not JSON"))
    # The running spec, unchanged: nothing to prepare, it stays healthy.
    assert run.cycle().phase == "healthy"
    run.desired = moved(run.desired)
    made = run.cycle()
    assert made.phase == "blocked" and not made.actions
    assert "index.json is unknown: is not JSON" in made.reason


def test_the_files_are_read_only_until_the_cutover_stops_the_old_serve_or_a_rollback() -> None:
    run = serving()
    with_files(run, files())
    assert not rollout.prepare_due(run.desired, run.memory)
    run.desired = moved(run.desired)
    assert rollout.prepare_due(run.desired, run.memory)
    cut = run.cycle()
    assert [a.kind for a in cut.actions] == ["restart_model"]
    # The old serve is stopped: nothing is left for the read to keep serving.
    assert not rollout.prepare_due(run.desired, run.memory)
    good = run.memory.last_good
    assert good is not None
    held = rollout.back(run.memory.evolve(rollout=None), run.desired, "ops", 0.0, 0.0)
    assert held.rollout is not None and held.rollout.stopped_at is None
    assert not rollout.prepare_due(run.desired, held)
    assert rollout.prepare_due(run.desired, rollout.retry(held, run.desired))


def test_a_first_deployment_with_a_missing_file_is_held_not_launched() -> None:
    toy = Toy.empty()
    run = Run(toy=toy, desired=toy.cluster)
    with_files(run, files(present=SHARDS[1:]))
    for _ in range(8):
        made = run.cycle()
        assert not any(a.kind in MODEL_STARTS for a in made.actions)
    assert made.phase == "blocked", made.reason
    assert f"waits: weight file {SHARDS[0]}" in made.reason and run.memory.blocked is None
    with_files(run, files())
    run.until("healthy")


READS = st.one_of(
    st.builds(
        files,
        present=st.lists(st.sampled_from(SHARDS), unique=True).map(tuple),
        size=st.sampled_from([0, 900, 1100]),
        index=st.sampled_from([WHOLE, None]),
        index_error=st.sampled_from([None, "is not JSON"]),
        config=st.booleans(),
    ),
    st.just(ModelFiles(directory=DIR, stat_error="stat exited 124")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.booleans(), READS, st.integers(1, 6)), min_size=1, max_size=5))
def test_a_cutover_never_starts_on_a_missing_file_or_an_unknown_index(
    steps: list[tuple[bool, ModelFiles, int]],
) -> None:
    run = serving()
    base = run.desired
    changes = 0
    for change, read, cycles in steps:
        with_files(run, read)
        if change:
            changes += 1
            run.desired = moved(base, f"/models/q-{changes}")
        for _ in range(cycles):
            before = run.memory
            made = run.cycle()
            steer = rollout.steer(run.desired, before)
            if made.rollback is not None or steer.held is not None:
                continue
            stops = [a for a in made.actions if a.kind in STOPS]
            if stops and rollout.prepare_due(run.desired, before):
                assert weights.unready(read) is None, (made.reason, read)


def test_an_index_nested_past_the_decoders_depth_is_unknown_not_a_crash() -> None:
    # What a hostile host may print for the index, within the reduced read's bound.
    said = weight_files.parse_index("[" * (weight_files.REDUCED_LIMIT - 1))
    assert isinstance(said, str) and "nested too deep" in said
