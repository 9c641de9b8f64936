"""Log lines: journald priority prefix, JSON, bound context, and no secrets from tracebacks."""

from __future__ import annotations

import io
import json
import logging

from sparkd.runtime import logs


def test_json_lines_with_priority_and_no_frame_locals() -> None:
    stream = io.StringIO()
    logs.configure("json", stream=stream)
    log = logs.get().bind(cluster="sparks")

    def probe_with(api_key: str) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        raise ConnectionError(f"lost while sending {len(headers)} header(s)")

    try:
        probe_with("sk-very-secret-key")
    except ConnectionError:
        log.exception("cycle_failed")
    log.warning("reboot_detected", host="spark-b")
    lines = stream.getvalue().splitlines()
    assert "sk-very-secret-key" not in stream.getvalue()
    assert lines[0].startswith("<3>{")
    first = json.loads(lines[0][3:])
    assert first["event"] == "cycle_failed" and first["cluster"] == "sparks"
    assert "exception" in first
    assert lines[1].startswith("<4>{")
    assert json.loads(lines[1][3:])["host"] == "spark-b"
    logging.getLogger().handlers.clear()
