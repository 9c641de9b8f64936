"""The settings every property test starts from, loaded by tests/conftest.py before any test
module is imported (a `settings(...)` object inherits what is unset from the profile loaded
when it is made).

A property checks what the code decides, never how fast: under `make test` two workers share
two cores with real vLLM's load and the etcd tier's daemons, and Hypothesis's 200 ms deadline and
its `too_slow` health check then failed examples that pass on an idle machine. Each test still
pins its own `max_examples`; CI's seeds are random, as Hypothesis's default.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("sparkd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sparkd")
