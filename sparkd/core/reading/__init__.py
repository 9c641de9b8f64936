"""Reading: what the hosts printed, parsed into the snapshot's values. Pure, total, bounded.

Each parser takes a host's (or a model's) text as it came and returns typed values, never a
guess: a missing or unreadable part is None or an error string. Nothing here judges: that is
core.judging's. Imports only the modules at core's root (spec, policy, text, clock)."""
