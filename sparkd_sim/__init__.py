"""Simulated DGX Spark hosts reachable over real SSH, for tests and `sparkd demo`.

Start a world with `World` (see `sparkd_sim.world`); run it from the command line with
`sparkd sim` (see `sparkd_sim.cli`). Nothing here imports the daemon's own code: a world that shared
the daemon's parsers would agree with it by construction.
"""

import warnings

# cryptography 51 deprecates DSA and asyncssh still names its DSA types when imported: ten
# lines of a warning meant for asyncssh's maintainers on every start, which broke one-line
# error messages on stderr. Only asyncssh's own DSA warnings are silenced.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
