"""First contact with a deployment made by hand (core.judging.adopt): adopted when it matches the
config, shown and left alone when it differs, replaced only on the operator's decision."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging import adopt
from sparkd.core.remembering.remember import remember
from sparkd.core.spec import container_name
from sparkd.model.memory import Memory
from sparkd.model.observed import ModelEndpoint, Observed, UnitState
from sparkd.model.plan import ACTION_KINDS, Plan
from tests.support.handmade import HEAD_BOX, SERVE_PID, WORKER_BOX, handmade, serve_words
from tests.support.planning import COMMON
from tests.toy import Toy

# What changes a host: everything but the cache's pruning, which only runs while sparkd's own
# launch is healthy.
MUTATING = set(ACTION_KINDS) - {"prune_cache"}


def first(observed: Observed, memory: Memory, toy: Toy) -> Plan:
    return plan(toy.cluster, observed, memory, toy.now)


def test_a_matching_deployment_is_adopted_without_an_action() -> None:
    toy, memory, observed = handmade()
    result = first(observed, memory, toy)
    assert result.phase == "healthy"
    assert result.actions == () and result.withheld == ()
    assert result.learned.adopted is not None
    assert result.learned.adopted.containers == {"spark-a": HEAD_BOX, "spark-b": WORKER_BOX}
    assert result.learned.adopted.serve_pid == SERVE_PID
    assert "adopted the deployment made by hand" in result.reason
    assert f"{HEAD_BOX} on spark-a" in result.reason and f"pid {SERVE_PID}" in result.reason


def test_adopting_waits_for_the_probe_and_touches_nothing() -> None:
    toy, memory, observed = handmade()
    observed = observed.model_copy(update={"probe": None})
    result = first(observed, memory, toy)
    assert result.phase == "probing"
    assert result.actions == () and result.learned.adopted is None
    assert "adopting the deployment made by hand" in result.reason
    assert "waiting for the probe" in result.reason


def test_a_different_image_would_be_replaced_and_nothing_runs() -> None:
    toy, memory, observed = handmade(image="someone/vllm-other:0.9")
    result = first(observed, memory, toy)
    assert result.phase == "blocked"
    assert result.actions == () and result.learned.adopted is None
    assert "would replace the deployment made by hand" in result.reason
    assert "image someone/vllm-other:0.9, config hellohal2064/vllm-qwen3.5-gb10" in result.reason
    # What a rollout to the config would do, shown: the hand-made containers go, sparkd's own
    # come in their place.
    shown = [(a.kind, a.host, a.target) for a in result.withheld]
    assert ("remove_container", "spark-a", HEAD_BOX) in shown
    assert ("remove_container", "spark-b", WORKER_BOX) in shown
    assert ("start_ray_head", "spark-a", container_name(toy.cluster, toy.cluster.head)) in shown


def test_a_different_ray_argument_is_named() -> None:
    toy = Toy.healthy()
    ip = toy.cluster.host("spark-b").ip
    words = ["ray", "start", "--block", "--address=192.168.200.99:6379", f"--node-ip-address={ip}"]
    toy, memory, observed = handmade(ray_args={"spark-b": words})
    result = first(observed, memory, toy)
    assert result.phase == "blocked" and result.actions == ()
    assert "--address 192.168.200.99:6379, config 192.168.200.12:6379" in result.reason


def test_a_different_env_is_named() -> None:
    toy, memory, observed = handmade(env={"NCCL_SOCKET_IFNAME": "eth0"})
    result = first(observed, memory, toy)
    assert result.phase == "blocked" and result.actions == ()
    assert "env NCCL_SOCKET_IFNAME is 'eth0', config 'enp1s0f0np0'" in result.reason


def test_a_different_serve_argument_is_named() -> None:
    toy = Toy.healthy()
    words = [w for w in serve_words(toy.cluster) if w != "--enable-auto-tool-choice"]
    toy, memory, observed = handmade(serve=[*words, "--max-model-len", "8192"])
    result = first(observed, memory, toy)
    assert result.phase == "blocked" and result.actions == ()
    assert "vllm serve --enable-auto-tool-choice unset, config (flag)" in result.reason
    assert "vllm serve --max-model-len 8192, config unset" in result.reason


def test_a_secret_env_value_is_never_shown() -> None:
    toy = Toy.healthy()
    cluster = toy.cluster
    env = {**cluster.ray.env, "RAY_AUTH_TOKEN": "hunter2"}
    toy.cluster = cluster.model_copy(update={"ray": cluster.ray.model_copy(update={"env": env})})
    _, memory, observed = handmade(env={"RAY_AUTH_TOKEN": "other-secret"})
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "env RAY_AUTH_TOKEN is set, config another value" in result.reason
    assert "hunter2" not in result.reason and "other-secret" not in result.reason


def test_the_operator_decides_replace() -> None:
    toy, memory, observed = handmade(image="someone/vllm-other:0.9")
    cluster = toy.cluster.model_copy(update={"adopt": "replace"})
    result = plan(cluster, observed, memory, toy.now)
    assert result.phase == "cleaning"
    assert {(a.kind, a.target) for a in result.actions} == {
        ("remove_container", HEAD_BOX),
        ("remove_container", WORKER_BOX),
    }
    assert 'adopt = "replace"' in result.reason


def _adopted() -> tuple[Toy, Memory, Observed]:
    toy, memory, observed = handmade()
    result = first(observed, memory, toy)
    memory = remember(memory, observed, [], toy.now, result)
    return toy, memory, observed


def test_adoption_is_remembered_as_a_launch() -> None:
    toy, memory, _ = _adopted()
    assert memory.adopted is not None
    assert memory.adopted.containers == {"spark-a": HEAD_BOX, "spark-b": WORKER_BOX}
    assert memory.launched_at == toy.now
    assert memory.model_ready_at == toy.now
    assert memory.launch_nodes == tuple(sorted(n.node_id for n in toy.ray_nodes))


def test_after_adoption_the_next_look_is_healthy_with_nothing_to_do() -> None:
    toy, memory, observed = _adopted()
    toy.advance(30)
    later = observed.model_copy(update={"observed_at": toy.now, "probe": None})
    result = plan(toy.cluster, later, memory, toy.now)
    assert result.phase == "healthy", result.reason
    assert result.actions == ()


def test_after_adoption_a_remedy_replaces_the_adopted_containers() -> None:
    toy, memory, observed = _adopted()
    toy.advance(30)
    # The adopted head's container exits: its Ray is gone, and the model with it.
    hosts = tuple(
        h.model_copy(
            update={
                "containers": tuple(
                    c.model_copy(update={"state": "exited", "status": "Exited (1) 1 second ago"})
                    if c.name == HEAD_BOX
                    else c
                    for c in h.containers
                ),
            }
        )
        for h in observed.hosts
    )
    broken = observed.model_copy(update={"hosts": hosts, "observed_at": toy.now, "probe": None})
    result = plan(toy.cluster, broken, memory, toy.now)
    assert {(a.kind, a.host, a.target) for a in result.actions} == {
        ("remove_container", "spark-a", HEAD_BOX),
        ("remove_container", "spark-b", WORKER_BOX),
    }
    assert all("replaced by sparkd's own launch" in a.reason for a in result.actions)
    # Once they are gone, sparkd's own launch follows, under its own names.
    toy.advance(5)
    gone = tuple(
        h.model_copy(
            update={
                "containers": tuple(c for c in h.containers if c.name not in (HEAD_BOX, WORKER_BOX))
            }
        )
        for h in broken.hosts
    )
    after = broken.model_copy(
        update={"hosts": gone, "observed_at": toy.now, "ray": None, "endpoint": None}
    )
    memory = remember(memory, broken, [], toy.now, result)
    relaunch = plan(toy.cluster, after, memory, toy.now)
    assert relaunch.learned.adoption_over
    memory = remember(memory, after, [], toy.now, relaunch)
    assert memory.adopted is None
    assert ("start_ray_head", container_name(toy.cluster, toy.cluster.head)) in {
        (a.kind, a.target) for a in relaunch.actions
    }


def test_no_hand_made_deployment_is_planned_as_before() -> None:
    toy = Toy.seed_morning()
    observed = toy.observe()
    observed = observed.model_copy(
        update={"hosts": tuple(h.model_copy(update={"foreign": ()}) for h in observed.hosts)}
    )
    result = plan(toy.cluster, observed, Memory(), toy.now)
    assert result.phase == "cleaning"
    assert "hand" not in result.reason


def test_unread_running_containers_hold_any_start_on_first_contact() -> None:
    toy, memory, observed = handmade()
    hosts = tuple(
        h.model_copy(update={"foreign": None, "foreign_error": "timed out"}) for h in observed.hosts
    )
    result = first(observed.model_copy(update={"hosts": hosts}), memory, toy)
    assert not {a.kind for a in result.actions} & {"start_ray_head", "start_ray_worker"}
    assert "could not be read" in result.reason


# -- the property: first contact changes nothing unless the operator decided -------------


@st.composite
def foreign_deployments(draw: st.DrawFn) -> tuple[Toy, Memory, Observed]:
    image = draw(st.sampled_from([None, "hellohal2064/vllm-qwen3.5-gb10:latest", "x/y:1"]))
    env = draw(
        st.dictionaries(
            st.sampled_from(["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "X"]),
            st.sampled_from(["enp1s0f0np0", "eth0", "0", "1"]),
            max_size=3,
        )
    )
    toy = Toy.healthy()
    base = serve_words(toy.cluster)
    serve = draw(
        st.one_of(
            st.none(),
            st.lists(st.sampled_from([*base, "--max-model-len", "4096", "--port", "8000"])),
        )
    )
    worker = toy.cluster.host("spark-b").ip
    address = draw(st.sampled_from(["192.168.200.12:6379", "192.168.200.12:6380", "10.0.0.1:6379"]))
    ray = ["ray", "start", "--block", f"--address={address}", f"--node-ip-address={worker}"]
    toy, memory, observed = handmade(image=image, env=env, serve=serve, ray_args={"spark-b": ray})
    if draw(st.booleans()):
        toy.cluster = toy.cluster.model_copy(update={"adopt": "replace"})
    if draw(st.booleans()):
        observed = observed.model_copy(update={"probe": None})
    if draw(st.booleans()):
        observed = observed.model_copy(update={"endpoint": None})
    return toy, memory, observed


@COMMON
@given(foreign_deployments())
def test_first_contact_changes_nothing_unless_the_operator_decided(
    world: tuple[Toy, Memory, Observed],
) -> None:
    toy, memory, observed = world
    result = plan(toy.cluster, observed, memory, toy.now)
    if toy.cluster.adopt == "replace":
        # The operator decided: only the hand-made containers go, and only if not adoptable.
        assert {(a.kind, a.target) for a in result.actions} <= {
            ("remove_container", HEAD_BOX),
            ("remove_container", WORKER_BOX),
        }
        assert result.phase in ("healthy", "probing", "cleaning"), result.reason
        return
    assert not {a.kind for a in result.actions} & MUTATING, result.reason
    assert result.phase in ("healthy", "probing", "blocked"), result.reason
    said = result.reason
    assert "adopt" in said or "would replace" in said, said


def test_the_planner_serve_words_are_the_launch_words() -> None:
    from sparkd.shell.catalogue.actions import serve_argv

    cluster = Toy.healthy().cluster
    assert serve_argv(cluster)[2:] == adopt.desired_serve(cluster)


def test_after_adoption_housekeeping_leaves_the_adopted_deployment_alone() -> None:
    toy, memory, observed = _adopted()
    toy.advance(30)
    head = toy.cluster.head.name
    unit = toy.cluster.cleanup.units[0]
    stale = UnitState(name=unit, active_state="inactive", unit_file_state="enabled")
    hosts = tuple(
        h.model_copy(update={"units": (stale,)}) if h.name == head else h for h in observed.hosts
    )
    later = observed.model_copy(update={"hosts": hosts, "observed_at": toy.now, "probe": None})
    result = plan(toy.cluster, later, memory, toy.now)
    assert [(a.kind, a.target) for a in result.actions] == [("stop_unit", unit)]


def test_waiting_to_adopt_ends_with_the_operator_asked() -> None:
    toy, memory, observed = handmade()
    refused = ModelEndpoint(status="refused", detail="connection refused")
    waiting = observed.model_copy(update={"probe": None, "endpoint": refused})
    result = first(waiting, memory, toy)
    assert result.phase == "probing", result.reason
    assert result.learned.adopting and "waiting for the model to answer" in result.reason
    memory = remember(memory, waiting, [], toy.now, result)
    assert memory.adopting_since == toy.now
    later = toy.now + toy.cluster.model.load_timeout + 1
    result = plan(toy.cluster, waiting.model_copy(update={"observed_at": later}), memory, later)
    assert result.phase == "blocked" and result.actions == ()
    assert "has not passed the probe in" in result.reason
    assert "would replace the deployment made by hand" in result.reason


def test_a_server_refusing_sparkds_key_is_never_adopted() -> None:
    toy, memory, observed = handmade()
    refusing = ModelEndpoint(status="http_error", detail="HTTP 401 from /v1/models")
    result = first(observed.model_copy(update={"endpoint": refusing}), memory, toy)
    assert result.phase == "blocked" and result.actions == () and result.learned.adopted is None
    assert "refuses sparkd's API key (HTTP 401 from /v1/models)" in result.reason


def test_an_api_key_on_the_command_line_is_the_configured_key_files_to_prove() -> None:
    toy = Toy.healthy()
    words = [*serve_words(toy.cluster), "--api-key", "sk-by-hand"]
    _, memory, observed = handmade(serve=words)
    assert first(observed, memory, toy).phase == "blocked"
    keyed = toy.cluster.model_copy(
        update={"model": toy.cluster.model.model_copy(update={"api_key_file": Path("/k")})}
    )
    result = plan(keyed, observed, memory, toy.now)
    assert result.phase == "healthy" and result.learned.adopted is not None, result.reason
    assert "sk-by-hand" not in result.reason
