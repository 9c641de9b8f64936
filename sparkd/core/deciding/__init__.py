"""Deciding: the planner (`plan(desired, observed, memory, now)`), the destructive-action gate,
power cycles, rollouts and their specs, the horizon of the next look. Pure.

Orders the stages' verdicts (core.judging) into one plan with a phase and a reason."""
