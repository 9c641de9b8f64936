"""sparkd's benchmark suite (`make bench`): each benchmark prints a table and writes JSON to
bench/results/. The simulated world runs as its own process (`sparkd sim`), so the daemon's CPU
and the simulated hosts' CPU are measured apart."""
