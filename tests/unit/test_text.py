"""Host and client text is printable once parsed: no control or bidi character survives."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.reading import parsers
from sparkd.core.reading.classify import classify_response
from sparkd.core.text import printable
from sparkd.shell.events import parse_event

ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b1m\u202e\u2066\x00\x7f\r"
CONTROLS = "\x1b\x07\x9b\u202e\u2066\x00\x7f\r"


def clean(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


def test_json_escaped_controls_in_a_tool_answer_are_replaced() -> None:
    # docker and Ray print JSON: a control arrives as `\u001b` and is one only once decoded.
    row = {"Names": f"head{ESCAPES}", "Image": "i", "State": "running", "Status": ESCAPES}
    [container] = parsers.parse_docker_ps(json.dumps(row))
    assert container.name.startswith("head") and clean(container.name + container.status)
    event = parse_event(json.dumps({"Action": "die", "Actor": {"Attributes": {"name": ESCAPES}}}))
    assert event is not None and clean(event.name)


def test_a_model_answer_with_controls_is_a_printable_detail() -> None:
    body = json.dumps({"choices": [{"message": {"content": f"Paris {ESCAPES}"}}]})
    assert clean(classify_response(200, body).detail)
    assert clean(classify_response(500, f"oops {ESCAPES}").detail)


@given(st.text())
def test_printable_keeps_everything_else(text: str) -> None:
    line = printable(text)
    assert len(line) == len(text) and clean(line) and "\n" not in line
    kept = printable(text, lines=True)
    assert clean(kept) and kept.count("\n") >= text.count("\n")
    assert all(a == b for a, b in zip(text, line, strict=True) if a.isprintable())
