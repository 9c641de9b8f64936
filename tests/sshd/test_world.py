"""The daemon's scenarios once more, with every simulated host behind a real OpenSSH sshd.

The scenario bodies are the asyncssh tier's own (tests/e2e, tests/live), imported here: pytest
runs them again with this directory's fixtures (conftest.py), whose worlds run sshd. Only what
OpenSSH alone can show is written here.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_judgement import (
    test_a_changed_host_key_is_reported_and_nothing_is_sent_to_that_host,
    test_a_hung_remote_tool_is_ended_on_the_host_and_the_daemon_reads_on,
)
from tests.e2e.test_recovery import (
    test_cold_start_from_seed_morning,
    test_head_reboot_recovers,
    test_model_crash_recovers,
    test_worker_reboot_recovers,
)
from tests.live.test_probe_outcomes import test_each_answer_style_is_classified

pytestmark = pytest.mark.sshd

__all__ = [
    "test_a_changed_host_key_is_reported_and_nothing_is_sent_to_that_host",
    "test_a_hung_remote_tool_is_ended_on_the_host_and_the_daemon_reads_on",
    "test_cold_start_from_seed_morning",
    "test_each_answer_style_is_classified",
    "test_head_reboot_recovers",
    "test_model_crash_recovers",
    "test_worker_reboot_recovers",
]
