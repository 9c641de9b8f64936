"""Durations that drive the simulated world.

`Timing.realistic()` holds what real Ray 2.60, Docker and vLLM on two Sparks measure
(tests/fixtures/ray-real/README.md). `Timing.fast()` is the test preset: every Ray and Docker
delay is the realistic one times `FAST_FACTOR`, the ratio of the tests' `recheck_interval` (0.2 s)
to the daemon's default (5 s), so Ray's lags stay in their real proportion to how often sparkd
looks again. Model loading keeps short fixed durations there (it is judged against config, not
against Ray). `scaled()` stretches or shrinks every duration at once, so a scenario keeps its
proportions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

REAL_RECHECK_INTERVAL = 5.0
"""sparkd's default `recheck_interval`."""
FAST_RECHECK_INTERVAL = 0.2
"""The `recheck_interval` the simulated-world tests run sparkd with."""
FAST_FACTOR = FAST_RECHECK_INTERVAL / REAL_RECHECK_INTERVAL

SLOW_LOAD_LOOKS = 15
"""How many of the tests' looks a `slow-load` load lasts under `fast()`. A real slow load (half an
hour at a 5 s interval) spans hundreds of looks; 3 x the fast preset's 0.15 s load ended within a
single look on a loaded machine, so a test never saw the load it was about."""

_NOT_DURATIONS = ("slow_load_factor", "cpu_scale")
# Durations `fast()` keeps as fixed short values instead of scaling the realistic ones.
_FAST_FIXED = {
    "model_init": 0.03,
    "model_load": 0.15,
    "graph_capture": 0.05,
    "reboot_downtime": 0.2,
}


@dataclass(frozen=True)
class Timing:
    # -- Ray: a head's start-up -----------------------------------------------------------------
    head_answer: float
    """Head launched -> `ray status` answers at all (before: rc 1, a traceback; measured ~4.4 s)."""
    head_listed: float
    """Head launched -> the head node in `ray list nodes` (before: `No resource in the cluster`;
    measured 10-15 s)."""
    head_counted: float
    """Head launched -> `ray status` shows the node and its GPU (before: `No cluster status.`;
    measured 13-16 s)."""
    # -- Ray: a worker joining ------------------------------------------------------------------
    worker_listed: float
    """Worker launched -> ALIVE in `ray list nodes` (measured 8-11 s)."""
    worker_counted: float
    """Worker launched -> in `ray status` `Active:` and its GPU counted (measured 10-14 s)."""
    # -- Ray: a node's death, as the head sees it -----------------------------------------------
    dead_listed: float
    """Raylet killed (container killed, host rebooted) -> DEAD in `ray list nodes` (14-16 s)."""
    dead_inactive: float
    """Raylet killed -> its id gone from `ray status` `Active:` (17-20 s)."""
    dead_uncounted: float
    """Raylet killed -> its GPU gone from `ray status` `Total Usage:` (23-25 s)."""
    hung_listed: float
    """Node hung (stopped processes, a host that stops answering) -> DEAD in list (63-64 s)."""
    hung_inactive: float
    """Node hung -> its id gone from `Active:` (between the two measured points)."""
    hung_uncounted: float
    """Node hung -> its GPU gone from `Total Usage:` (69-70 s)."""
    stop_listed: float
    """`ray stop` -> DEAD (`Expected termination: received SIGTERM`) in list (2-5 s)."""
    stop_inactive: float
    """`ray stop` -> its id gone from `Active:` (~8 s)."""
    stop_uncounted: float
    """`ray stop` -> its GPU gone from `Total Usage:` (11-13 s)."""
    # -- Ray: a worker whose head went away ------------------------------------------------------
    head_mismatch: float
    """A new head came up where the worker's head was: the worker's raylet dies this long after
    (cluster ID mismatch; measured ~33 s), then its `ray start --block` exits 1."""
    gcs_reconnect_timeout: float
    """The head went away and none came back: the worker's raylet gives up after this (Ray's
    `gcs_rpc_server_reconnect_timeout_s`, 60 s)."""
    join_retry: float
    """How often a worker with no head retries (it never gives up)."""
    pg_wait_first: float
    """vLLM waits this long for its placement group before its first `Waiting for creating a
    placement group` line (10 s), then twice as long each time."""
    pg_wait_timeout: float
    """vLLM gives up on its placement group after this (1800 s)."""
    # -- Docker ---------------------------------------------------------------------------------
    restart_backoff: float
    """Docker's first restart delay for a container whose process exited (100 ms), doubled
    after each restart."""
    restart_backoff_max: float
    """Docker's longest restart delay (1 min)."""
    restart_reset: float
    """A container that ran at least this long restarts with the first delay again (10 s)."""
    crash_loop_run: float
    """How long a crash-looping container's process runs before it exits again."""
    size_walk: float
    """Seconds the daemon spends per GB of writable layer when a listing asks for sizes (`docker
    ps -s`, or a template using `.Size`): 6.4 s for one 4 GB container (docker/for-linux#1179).
    (The walk's cost follows the files rather than the bytes: 150,000 empty files took 6.5-8.6 s,
    tests/fixtures/docker-real/size.jsonl.)"""
    # -- vLLM and hosts -------------------------------------------------------------------------
    model_init: float
    """`vllm serve` start until weight loading begins (Ray placement, NCCL init)."""
    model_load: float
    """Loading the checkpoint shards."""
    graph_capture: float
    """CUDA graph capture after the weights are in."""
    reboot_downtime: float
    """SSH refuses connections this long after a reboot."""
    slow_load_factor: float
    """Multiplier applied to loading under the `slow-load` fault."""
    stall_chatter: float
    """A stuck engine's warnings/heartbeats come this often (the log's mtime keeps moving)."""
    cpu_scale: float
    """Simulated CPU seconds a fully busy core accrues per wall second (1 in real time; in a
    faster world more, so CPU time rises as much per recheck interval as for real)."""

    @classmethod
    def realistic(cls) -> Timing:
        return cls(
            head_answer=4.4,
            head_listed=12.0,
            head_counted=14.5,
            worker_listed=9.5,
            worker_counted=12.0,
            dead_listed=15.0,
            dead_inactive=18.5,
            dead_uncounted=24.0,
            hung_listed=63.5,
            hung_inactive=66.5,
            hung_uncounted=69.5,
            stop_listed=3.5,
            stop_inactive=8.0,
            stop_uncounted=12.0,
            head_mismatch=33.0,
            gcs_reconnect_timeout=60.0,
            join_retry=2.0,
            pg_wait_first=10.0,
            pg_wait_timeout=1800.0,
            restart_backoff=0.1,
            restart_backoff_max=60.0,
            restart_reset=10.0,
            crash_loop_run=5.0,
            size_walk=1.6,
            model_init=30.0,
            model_load=600.0,
            graph_capture=120.0,
            reboot_downtime=90.0,
            slow_load_factor=3.0,
            stall_chatter=20.0,
            cpu_scale=1.0,
        )

    @classmethod
    def fast(cls) -> Timing:
        """Realistic Ray and Docker delays times `FAST_FACTOR`; short model loads, and a slow
        load that spans `SLOW_LOAD_LOOKS` looks."""
        fixed = _FAST_FIXED["model_load"]
        return dataclasses.replace(
            cls.realistic().scaled(FAST_FACTOR),
            **_FAST_FIXED,
            slow_load_factor=SLOW_LOAD_LOOKS * FAST_RECHECK_INTERVAL / fixed,
        )

    def scaled(self, factor: float) -> Timing:
        """Every duration multiplied by `factor` (factors stay as they are)."""
        if factor <= 0:
            raise ValueError(f"scale factor must be positive, got {factor}")
        changes = {
            f.name: getattr(self, f.name) * factor
            for f in dataclasses.fields(self)
            if f.name not in _NOT_DURATIONS
        }
        return dataclasses.replace(self, **changes, cpu_scale=self.cpu_scale / factor)
