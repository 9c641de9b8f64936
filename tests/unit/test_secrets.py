"""Secrets: one redaction of the current and previous API key and the control token for every
string that leaves the process; a rotated key rolls out; a refused key is not a load."""

from __future__ import annotations

import html
import io
import json
import logging
import re
import urllib.parse
from pathlib import Path

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.spec import key_fingerprint
from sparkd.model.memory import Memory
from sparkd.model.observed import ModelEndpoint, Observed, ServeState
from sparkd.model.plan import Action
from sparkd.runtime import logs
from sparkd.shell import catalogue
from sparkd.shell.observe import redacted
from sparkd.shell.secrets import REDACTOR, prime, read_secret, redact, redact_json
from tests.toy import Toy

KEY_A = "sk-alpha-7f3c9e1d2b4a"
KEY_B = "sk-bravo-0a9b8c7d6e5f"
TOKEN = "ctl-token-5e6f7a8b9c0d"


@pytest.fixture(autouse=True)
def clean_redactor(monkeypatch: pytest.MonkeyPatch) -> None:
    # The process-wide redactor starts each test knowing no secret, and is back as it was after.
    monkeypatch.setattr(REDACTOR, "_by_path", {})
    monkeypatch.setattr(REDACTOR, "_secrets", ())
    monkeypatch.setattr(REDACTOR, "_pattern", None)


def write(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def test_current_and_previous_key_and_the_token_are_masked(tmp_path: Path) -> None:
    key_file = write(tmp_path / "api_key", KEY_A)
    token_file = write(tmp_path / "token", TOKEN)
    prime([key_file, token_file, None, tmp_path / "missing"])
    write(key_file, KEY_B)
    assert read_secret(key_file) == KEY_B
    text = f"a={KEY_A} b={KEY_B} t={TOKEN} Authorization: Bearer other-secret"
    assert redact(text) == "a=*** b=*** t=*** Authorization: Bearer ***"
    # Two rotations later the first key is no longer the previous one.
    write(key_file, "sk-charlie-11223344")
    read_secret(key_file)
    assert KEY_B not in redact(KEY_B) and KEY_A in redact(KEY_A)
    nested = redact_json({"k": [TOKEN, {TOKEN: 1}], "n": 3, "none": None})
    assert json.dumps(nested).count(TOKEN) == 0 and nested["n"] == 3


def test_log_lines_are_redacted_in_both_formats(tmp_path: Path) -> None:
    prime([write(tmp_path / "api_key", KEY_A), write(tmp_path / "token", TOKEN)])
    for fmt in ("json", "console"):
        stream = io.StringIO()
        logs.configure(fmt, stream=stream)  # type: ignore[arg-type]
        log = logs.get().bind(cluster="sparks")
        log.warning("planted", detail=f"key {KEY_A}", nested={"token": [TOKEN]}, number=7)
        try:
            raise ConnectionError(f"peer echoed Authorization: Bearer {KEY_A} and {TOKEN}")
        except ConnectionError:
            log.exception("cycle_failed")
        logging.getLogger("aiohttp.server").error("foreign %s", TOKEN)
        out = stream.getvalue()
        assert KEY_A not in out and TOKEN not in out, (fmt, out)
        assert out.count("***") >= 5, (fmt, out)
        assert "planted" in out and "cycle_failed" in out and "foreign" in out
    logging.getLogger().handlers.clear()


def test_observation_is_redacted_everywhere(tmp_path: Path) -> None:
    prime([write(tmp_path / "token", TOKEN)])
    toy = Toy.healthy()
    seen = toy.observe()
    seen = seen.model_copy(
        update={
            "serve": ServeState(running=False, log_tail=(f"launched with {TOKEN}",)),
            "endpoint": ModelEndpoint(status="error", detail=f"broken: {TOKEN}"),
        }
    )
    clean = redacted(seen)
    assert TOKEN not in clean.model_dump_json()
    assert clean.serve is not None and clean.serve.log_tail == ("launched with ***",)
    result = plan(toy.cluster, clean, Memory(launched_at=toy.serve_started), clean.observed_at)
    assert TOKEN not in result.model_dump_json()
    assert "***" in result.reason


def keyed(toy: Toy) -> Toy:
    model = toy.cluster.model.model_copy(update={"api_key_file": Path("/etc/sparkd/api_key")})
    toy.cluster = toy.cluster.model_copy(update={"model": model})
    return toy


def launched_hash(toy: Toy, key: str) -> str:
    """The hash `start_model` writes beside the log, read back from the command it sends."""
    command = catalogue.actions.start_model(toy.cluster, 10, key).command
    written = re.search(r"printf '%s\\n' ([0-9a-f]{12}) ", command)
    assert written is not None, command
    return written.group(1)


def healthy_keyed(key: str) -> tuple[Toy, Memory]:
    toy = keyed(Toy.healthy())
    toy.serve_spec = launched_hash(toy, key)
    memory = Memory(
        launched_at=toy.serve_started,
        launch_nodes=tuple(sorted(n.node_id for n in toy.ray_nodes if n.alive)),
        model_ready_at=toy.now - 100,
        last_probe_at=toy.now - 60,
    )
    return toy, memory


def observe_with_key(toy: Toy, key: str | None) -> Observed:
    fingerprint = key_fingerprint(key) if key is not None else None
    return toy.observe().model_copy(update={"api_key_fingerprint": fingerprint})


def test_an_unchanged_key_restarts_nothing_and_a_rotated_one_rolls_out() -> None:
    toy, memory = healthy_keyed(KEY_A)
    same = plan(toy.cluster, observe_with_key(toy, KEY_A), memory, toy.now)
    assert same.phase == "healthy" and not same.actions, same.reason
    rotated = plan(toy.cluster, observe_with_key(toy, KEY_B), memory, toy.now)
    assert [a.kind for a in rotated.actions] == ["restart_model"], rotated.reason
    assert "spec drift" in rotated.reason
    # The fingerprint never carries the key.
    assert KEY_A not in launched_hash(toy, KEY_A) and KEY_B not in rotated.model_dump_json()
    toy.apply(rotated.actions[0])
    toy.serve_spec = launched_hash(toy, KEY_B)
    after = plan(toy.cluster, observe_with_key(toy, KEY_B), memory, toy.now)
    assert "restart_model" not in [a.kind for a in after.actions], after.reason


def test_an_unreadable_key_is_not_taken_for_drift() -> None:
    toy, memory = healthy_keyed(KEY_A)
    unknown = plan(toy.cluster, observe_with_key(toy, None), memory, toy.now)
    assert "restart_model" not in [a.kind for a in unknown.actions], unknown.reason


def test_a_model_refusing_the_key_is_never_loading() -> None:
    toy = Toy.empty()
    for host in toy.cluster.hosts:
        kind = "start_ray_head" if host.role == "head" else "start_ray_worker"
        toy.apply(Action(kind=kind, host=host.name, target="", reason="setup"))
    toy.apply(Action(kind="start_model", host=toy.cluster.head.name, target="", reason=""))
    toy.advance(120)  # the log still shows weights loading
    seen = toy.observe()
    assert plan(toy.cluster, seen, Memory(), seen.observed_at).phase == "loading"
    refused = ModelEndpoint(
        status="http_error", health_status=200, detail="/v1/models answered HTTP 401"
    )
    result = plan(toy.cluster, seen.model_copy(update={"endpoint": refused}), Memory(), toy.now)
    assert result.phase != "loading", result.reason
    assert "http_error" in result.reason and "401" in result.reason


BASE64_KEY = "sk-Zm9v/YmFy+YmF6=="


@pytest.mark.parametrize(
    "echoed",
    [
        BASE64_KEY,
        urllib.parse.quote(BASE64_KEY, safe=""),
        urllib.parse.quote(BASE64_KEY, safe="").lower(),
        urllib.parse.quote(BASE64_KEY),
        urllib.parse.quote(urllib.parse.quote(BASE64_KEY, safe=""), safe=""),
        json.dumps(BASE64_KEY)[1:-1].replace("/", "\\/"),
        BASE64_KEY.replace("+", "\\u002B"),
        BASE64_KEY.lower(),
        BASE64_KEY.upper(),
        BASE64_KEY.swapcase(),
        html.escape(BASE64_KEY).replace("/", "&#47;").replace("=", "&#x3D;"),
    ],
)
def test_an_echoed_key_is_masked_in_its_escaped_and_folded_forms(
    tmp_path: Path, echoed: str
) -> None:
    prime([write(tmp_path / "api_key", BASE64_KEY)])
    line = f"HTTP 401: {{'detail': 'invalid key {echoed}'}}"
    assert redact(line) == "HTTP 401: {'detail': 'invalid key ***'}", echoed
    assert "zm9v" not in json.dumps(redact_json({"d": line})).lower()
