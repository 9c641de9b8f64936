"""The functional core: pure decisions, no I/O, no clock."""
