"""Kernel log and meminfo parsers against real line formats (tests/fixtures/kernel)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.reading import kernel
from sparkd.model.observed import KernelLog
from sparkd.shell.ssh import MAX_OUTPUT

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"


def sample(name: str) -> str:
    return (KERNEL / name).read_text()


def test_xid_79_is_one_event_needing_a_reboot() -> None:
    log = kernel.parse_kernel_log(sample("xid-79.txt"))
    assert log.lines == 3 and log.last_at == 812.40213
    [event] = log.events
    assert (event.kind, event.xid, event.device) == ("xid", 79, "PCI:000f:01:00")
    assert kernel.fatal_xid(event)
    assert "fallen off the bus" in kernel.describe(event)


def test_a_flood_of_xid_13_is_counted_once_and_never_fatal() -> None:
    [event] = kernel.parse_kernel_log(sample("xid-13.txt")).events
    assert (event.xid, event.count, event.first_at, event.last_at) == (
        13,
        3,
        4410.118204,
        4410.119007,
    )
    assert not kernel.fatal_xid(event)
    assert "x3" in kernel.describe(event)


def test_xid_45_is_a_teardown() -> None:
    [event] = kernel.parse_kernel_log(sample("xid-45.txt")).events
    assert event.xid == 45 and event.count == 2
    assert kernel.xid_info(45).severity == "teardown"
    assert not kernel.fatal_xid(event)


def test_the_catalogue_says_which_xids_need_a_reboot() -> None:
    fatal = {n for n, info in kernel.XIDS.items() if info.severity == "reboot"}
    assert fatal == {48, 64, 74, 79, 94, 95, 119, 120}
    # XID 154 is fatal by the action it names (tests/unit/test_kernel_gsp.py), not by number.
    assert kernel.xid_info(154).severity == "hardware"
    assert {kernel.xid_info(n).severity for n in (13, 31, 43)} == {"application"}
    assert kernel.xid_info(63).severity == kernel.xid_info(92).severity == "hardware"
    # An XID sparkd does not know is reported, never taken for a lost GPU.
    assert kernel.xid_info(1234).severity == "hardware"


def test_nv_no_memory_flood_is_a_wedge_omen() -> None:
    [event] = kernel.parse_kernel_log(sample("nv-no-memory.txt")).events
    assert event.kind == "nv_no_memory" and event.count == 3
    assert event.kind in kernel.WEDGE_OMENS


def test_fatal_aer_and_mlx5_but_not_the_non_fatal_line() -> None:
    events = kernel.parse_kernel_log(sample("aer-fatal.txt")).events
    kinds = sorted((e.kind, e.device, e.count) for e in events)
    assert kinds == [
        ("aer_fatal", "0000:00:00.0", 1),
        ("aer_fatal", "0000:01:00.0", 1),
        ("mlx5_pci_error", "0000:01:00.0", 1),
    ]


def test_soft_lockup_and_oom_kill() -> None:
    [lockup] = kernel.parse_kernel_log(sample("soft-lockup.txt")).events
    assert lockup.kind == "soft_lockup" and lockup.count == 2
    [oom] = kernel.parse_kernel_log(sample("oom-kill.txt")).events
    assert oom.kind == "oom_kill" and oom.kind not in kernel.WEDGE_OMENS


def test_a_quiet_log_has_lines_and_no_events() -> None:
    log = kernel.parse_kernel_log(sample("quiet.txt"))
    assert log.events == () and log.lines == 3 and log.last_at == 14.305587


def test_a_journal_the_user_may_not_read_is_unreadable_not_quiet() -> None:
    text = sample("no-access.txt")
    assert kernel.unreadable(text) is not None and "systemd-journal" in (
        kernel.unreadable(text) or ""
    )
    assert kernel.unreadable(sample("quiet.txt")) is None


def test_new_since_counts_only_lines_after_the_mark() -> None:
    log = kernel.parse_kernel_log(sample("xid-13.txt") + sample("xid-79.txt"))
    assert sorted((e.xid, n) for e, n in kernel.new_since(log, None)) == [(13, 3), (79, 1)]
    assert [(e.xid, n) for e, n in kernel.new_since(log, 4410.118204)] == [(13, 2)]
    assert kernel.new_since(log, log.last_at) == []


def test_meminfo() -> None:
    available, total = kernel.parse_meminfo(sample("meminfo-gb10.txt"))
    assert available == 104283952 * 1024 and total == 125488340 * 1024
    assert kernel.parse_meminfo("MemAvailable: lots\n") == (None, None)


@given(st.text())
def test_the_parsers_are_total(text: str) -> None:
    log = kernel.parse_kernel_log(text)
    assert isinstance(log, KernelLog) and log.lines >= sum(e.count for e in log.events) >= 0
    kernel.unreadable(text)
    kernel.parse_meminfo(text)
    for event in log.events:
        kernel.describe(event)


@given(st.lists(st.sampled_from(sorted(KERNEL.glob("*.txt"))), max_size=6), st.text(max_size=40))
def test_samples_with_noise_between_them_still_parse(names: list[Path], noise: str) -> None:
    text = "\n".join(p.read_text() + noise for p in names)
    kernel.parse_kernel_log(text)


# One repeated XID line as a broken or hostile host may print it until the SSH output cap
# (8 MiB, about 160,000 such lines) although the script asked for the last 200.
FLOOD_LINE = "[ 4410.118204] spark-b kernel: NVRM: Xid (PCI:000f:01:00): 13, pid=1, name=x, Ch 8\n"


def test_a_flooded_log_is_read_to_its_last_200_lines_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = FLOOD_LINE * (MAX_OUTPUT // len(FLOOD_LINE))
    classified = 0
    classify = kernel._classify

    def counting(message: str) -> object:
        nonlocal classified
        classified += 1
        return classify(message)

    monkeypatch.setattr(kernel, "_classify", counting)
    log = kernel.parse_kernel_log(text)
    assert classified == kernel.TAIL_LINES
    assert log.lines == kernel.TAIL_LINES
    [event] = log.events
    assert event.count == kernel.TAIL_LINES and len(event.times) == kernel.TAIL_LINES
    assert [(e.xid, n) for e, n in kernel.new_since(log, None)] == [(13, kernel.TAIL_LINES)]


def test_the_tail_is_the_last_lines_with_their_own_stamps() -> None:
    old = "".join(f"[ {t}.000000] NVRM: Xid (PCI:0000:01:00): 79, pid=1\n" for t in range(1000))
    new = "".join(
        f"[ {t}.000000] NVRM: Xid (PCI:0000:01:00): 13, pid=1\n" for t in range(1000, 1200)
    )
    log = kernel.parse_kernel_log(old + "not a kernel line\n" * 5000 + new)
    assert [(e.xid, e.count, e.first_at, e.last_at) for e in log.events] == [(13, 200, 1000, 1199)]
    assert [n for _, n in kernel.new_since(log, 1149.0)] == [50]


def test_a_long_line_is_cut_before_any_pattern_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    line = "[ 1.000000] " + "NVRM:" * (MAX_OUTPUT // 5 // 200) + "\n"
    seen: list[int] = []
    classify = kernel._classify

    def measuring(message: str) -> object:
        seen.append(len(message))
        return classify(message)

    monkeypatch.setattr(kernel, "_classify", measuring)
    log = kernel.parse_kernel_log(line * 200)
    assert log.events == () and log.lines == 200
    assert seen == [kernel.MESSAGE_LIMIT] * 200


@given(st.lists(st.sampled_from(["NVRM:", "NVRM", ":", " ", "x", "NV_ERR_NO_MEMORY", "_"])))
def test_no_memory_is_found_as_the_one_regex_found_it(words: list[str]) -> None:
    # The old single regex, quadratic in a line full of `NVRM:`; the split search must agree.
    message = "".join(words)
    found = kernel._classify(message)
    old = re.search(r"NVRM:.*\bNV_ERR_NO_MEMORY\b", message) is not None
    assert (found is not None and found[0] == "nv_no_memory") == old
