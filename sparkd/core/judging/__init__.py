"""Judging: one stage per concern (Ray, the model, the probe, the fabric, the kernel, the
compile cache, cleanup), each taking the cycle's context and returning a verdict. Pure.

A stage reads the snapshot and memory and says what it saw and what it would do; the planner
(core.deciding) orders the verdicts and gates destructive actions. Imports core.reading and the
root modules, never the planner or memory's transition."""
