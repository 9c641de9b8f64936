"""Remembering: memory's one transition after a cycle (`remember`) and memory crossing to
another box (`handover`). Pure.

Reads the stages' evidence (core.judging); never the planner."""
