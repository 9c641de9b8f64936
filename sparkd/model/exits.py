"""Exit statuses, named once: those sparkd's own commands return (sysexits(3)), and those a
host's fenced command returns (shell.catalogue's fence function, shell.forced's wrapper).

Note the difference: `EX_TEMPFAIL` and `FENCE_BUSY_EXIT` share 75, `EX_NOPERM` and
`FENCE_MISMATCH_EXIT` share 77, but the first of each pair is sparkd's CLI answering its
caller, the second a host answering sparkd.
"""

from __future__ import annotations

# sparkd's commands (sysexits.h).
EX_USAGE = 64
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_CANTCREAT = 73
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_CONFIG = 78

# A fenced mutating command on a host: the lock stayed busy past its wait.
FENCE_BUSY_EXIT = 75
# Refused: the host recorded a newer owner's token for the cluster.
FENCED_EXIT = 76
# The fence file names another etcd (rebuilt: revisions restarted) or cannot be read: every
# command is refused until an operator runs `sparkd ha refence CLUSTER`.
FENCE_MISMATCH_EXIT = 77
# The forced-command wrapper refused a command it does not know (as a shell's "cannot execute").
REFUSED_EXIT = 126

# coreutils `timeout` ends a command that outlives it with this status (timeout(1)).
TIMED_OUT_EXIT = 124

# The dashboard GET's exit statuses on a host beyond 0 (answered: `HTTP <status>`, a newline,
# the body; shell.catalogue.reads `dashboard_get`): nothing listens; the body is larger than the
# cap (nothing of it printed); any other failure (its exception's name printed after `!`).
DASHBOARD_REFUSED_EXIT = 3
DASHBOARD_TOO_LARGE_EXIT = 4
DASHBOARD_FAILED_EXIT = 5
