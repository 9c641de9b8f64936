"""Simulated DGX Spark hosts reachable over real SSH, for tests and `sparkd demo`.

Start a world with `World` (see `sparkd_sim.world`); run it from the command line with
`sparkd sim` (see `sparkd_sim.cli`). Nothing here imports the daemon's own code: a world that shared
the daemon's parsers would agree with it by construction.
"""
