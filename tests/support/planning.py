"""What the planner's named cases and property tests share: generated situations over the
example set, a host's reading changed in a snapshot, the kinds of a plan's actions, a sound
fabric port."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from sparkd.core.judge import MODEL_STARTS, RAY_STARTS
from sparkd.model.memory import Memory
from sparkd.model.observed import Fabric, Observed
from sparkd.model.plan import Plan
from tests.examples import EXAMPLE_SET
from tests.toy import Toy

COMMON = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STARTS = RAY_STARTS | MODEL_STARTS
BASES = [e for e in EXAMPLE_SET if e.name != "seed-morning"]


def host(observed: Observed, name: str, **update: Any) -> Observed:
    hosts = tuple(h.model_copy(update=update) if h.name == name else h for h in observed.hosts)
    return observed.model_copy(update={"hosts": hosts})


def kinds(result: Plan, host_name: str | None = None) -> set[str]:
    return {a.kind for a in result.actions if host_name is None or a.host == host_name}


@st.composite
def situations(draw: st.DrawFn) -> tuple[Toy, Memory, float]:
    example = draw(st.sampled_from(BASES))
    toy, memory = example.build()
    return toy, memory, toy.now + draw(st.floats(0, 120))


# The port tests/fixtures/fabric/healthy.txt shows: what a host's data link reads when sound.
SOUND = Fabric(
    mtu=9000,
    carrier_changes=2,
    rdma_device="rocep1s0f0",
    port=1,
    port_state="ACTIVE",
    phys_state="LinkUp",
    rate_gbps=200.0,
    gid_index=3,
)
