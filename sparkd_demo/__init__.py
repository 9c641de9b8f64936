"""The consumer side of the simulator: `sparkd-sim`, the demo, and the wiring that hands the
simulated world sparkd's own spec hashes. It imports both `sparkd` and `sparkd_sim`; neither
of them imports it or each other."""
