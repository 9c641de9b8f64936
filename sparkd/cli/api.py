"""The subcommands that talk to the running daemon's API: status, pause, resume, reconcile,
rollout.

They read the daemon's address from the config file and make one HTTP request: on the daemon's
Unix socket (`daemon.socket`, sparkd.web.unix) when it is there and this user may use it, else to
loopback over TCP. Standard library only, so a command costs little more than Python's own start
(no settings model, no SSH library, no HTTP client library): the one request is written and its
answer read here, because `http.client` alone (with the `email` parser and `ssl` it loads) took
half of a status command's start; an `https://` `--url` still goes through `http.client`.
`sparkd.cli` dispatches them here first.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import stat
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from sparkd.config_file import DaemonAddress, config_path, daemon_address
from sparkd.model.exits import EX_NOPERM, EX_UNAVAILABLE, EX_USAGE

BAR = 20
COMMANDS = ("status", "pause", "resume", "reconcile", "rollout")
# As long as the whole request may take (connect, send, answer).
TIMEOUT = 15.0
# An answer longer than this is not the daemon's (its /status for thousands of clusters is a
# few MiB).
MAX_ANSWER = 64 << 20


def config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $SPARKD_CONFIG or /etc/sparkd/sparkd.toml)",
    )


def config_command(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand's parser (on subparsers `sub`) that reads the config file."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=text)
    config_flag(parser)
    return parser


def _api_command(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand's parser with the flags every API command takes."""
    parser = config_command(sub, name, text)
    parser.add_argument("--url", help="the daemon's API (default: from daemon.listen)")
    return parser


def add_commands(sub: Any) -> None:
    """The daemon commands' parsers, on `sparkd`'s subparsers (`sub`)."""
    status = _api_command(sub, "status", "what the running daemon sees and does")
    status.add_argument("--json", action="store_true")

    for name, text in (
        ("pause", "stop acting on a cluster (it is still observed)"),
        ("resume", "act again; also clears a blocked latch"),
        ("reconcile", "run a cycle now"),
    ):
        control = _api_command(sub, name, text)
        control.add_argument("cluster")
        if name == "pause":
            control.add_argument("--reason", required=True)
            control.add_argument("--for", dest="duration", help="expiry, e.g. 30m, 2h, 1d")

    rollout = sub.add_parser("rollout", help="the latest rollout of a spec change; retry, back")
    rollout_sub = rollout.add_subparsers(dest="rollout_command", required=True, metavar="ACTION")
    for name, text in (
        ("status", "desired, running and last-good specs, what differs, the latest rollout"),
        ("retry", "roll the desired spec out again after a rollback"),
        ("back", "go to the last-good spec now, and hold it"),
    ):
        action = _api_command(rollout_sub, name, text)
        action.add_argument("cluster", nargs="?" if name == "status" else None)
        if name == "status":
            action.add_argument("--json", action="store_true")


def run(argv: Sequence[str]) -> int:
    """`sparkd COMMAND ...` for a daemon command, parsed without the rest of sparkd."""
    parser = argparse.ArgumentParser(prog="sparkd")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return main(parser.parse_args(list(argv)))


def _url(args: argparse.Namespace, daemon: DaemonAddress) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    host, _, port = daemon.listen.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


class _Unreachable(Exception):
    pass


def _socket_for(args: argparse.Namespace, daemon: DaemonAddress) -> str | None:
    """The daemon's socket when this command should use it: no `--url` given, the socket there,
    and this user one the daemon admits (root, or the socket's owner: the daemon's user)."""
    if args.url or daemon.socket is None:
        return None
    try:
        found = os.stat(daemon.socket)
    except OSError:  # absent, or a directory this user may not enter
        return None
    if not stat.S_ISSOCK(found.st_mode) or os.geteuid() not in (0, found.st_uid):
        return None
    return daemon.socket


def _connect(url: str, unix: str | None) -> tuple[socket.socket, str, str]:
    """A connected socket, the Host header and the path prefix of the API: the Unix socket
    when it accepts, else TCP to `url` (a socket that refuses sent nothing, so nothing is sent
    twice)."""
    if unix is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(unix)
            return sock, "localhost", ""
        except OSError:
            sock.close()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise _Unreachable(f"not an http(s) URL: {url!r}")
    port = parts.port or 80
    sock = socket.create_connection((parts.hostname, port), timeout=TIMEOUT)
    return sock, parts.netloc, parts.path.rstrip("/")


def _exchange(
    sock: socket.socket,
    method: str,
    target: str,
    host: str,
    headers: dict[str, str],
    body: bytes | None,
) -> tuple[int, bytes]:
    """One HTTP/1.1 request with `Connection: close`, and the answer's status and body."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(body or b'')}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    deadline = time.monotonic() + TIMEOUT
    chunks: list[bytes] = []
    size = 0
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_ANSWER:
            raise _Unreachable(f"an answer over {MAX_ANSWER} bytes")
        chunks.append(chunk)
    head, blank, rest = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    version, _, code = status_line.partition(" ")
    code = code[:3]
    if not blank or not version.startswith("HTTP/1.") or not code.isdigit():
        raise _Unreachable("not an HTTP answer")
    named = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
    if named.get("transfer-encoding", "").lower() == "chunked":
        rest = _unchunk(rest)
    elif named.get("content-length", "").isdigit():
        length = int(named["content-length"])
        if len(rest) < length:
            raise _Unreachable("the answer was cut off")
        rest = rest[:length]
    return int(code), rest


def _unchunk(data: bytes) -> bytes:
    """A chunked body's content (RFC 9112 section 7.1), trailers dropped."""
    out: list[bytes] = []
    at = 0
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            raise _Unreachable("the answer was cut off")
        try:
            size = int(data[at:end].split(b";", 1)[0], 16)
        except ValueError:
            raise _Unreachable("not an HTTP answer") from None
        if size == 0:
            return b"".join(out)
        start = end + 2
        if len(data) < start + size:
            raise _Unreachable("the answer was cut off")
        out.append(data[start : start + size])
        at = start + size + 2


def _request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    unix: str | None = None,
) -> tuple[int, bytes]:
    sent = dict(headers or {})
    if body is not None:
        sent["Content-Type"] = "application/json"
    if unix is None and url.startswith("https://"):
        return _request_tls(url, method, path, body, sent)
    sock: socket.socket | None = None
    try:
        sock, host, prefix = _connect(url, unix)
        return _exchange(sock, method, f"{prefix}{path}", host, sent, body)
    except (OSError, ValueError) as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from None
    finally:
        if sock is not None:
            sock.close()


def _request_tls(
    url: str, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes]:
    """An `https://` `--url` (a daemon behind a TLS proxy): through `http.client`, loaded only
    here."""
    import http.client

    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise _Unreachable(f"not an http(s) URL: {url!r}")
    connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=TIMEOUT)
    try:
        connection.request(method, f"{parts.path.rstrip('/')}{path}", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(MAX_ANSWER)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from None
    finally:
        connection.close()


def main(args: argparse.Namespace) -> int:
    daemon = daemon_address(config_path(args.config))
    url = _url(args, daemon)
    unix = _socket_for(args, daemon)
    try:
        if args.command == "status":
            status, raw = _request(url, "GET", "/status", unix=unix)
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Unreachable(f"HTTP {status}: not a JSON answer") from None
            if args.json:
                print(json.dumps(body, indent=2))
            else:
                print(render_status(body))
            return 0
        if args.command == "rollout" and args.rollout_command == "status":
            status, raw = _request(url, "GET", "/status", unix=unix)
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Unreachable(f"HTTP {status}: not a JSON answer") from None
            return print_rollouts(body, args.cluster, args.json)
        return _control(url, args, daemon, unix)
    except _Unreachable as exc:
        where = url if unix is None else f"unix:{unix} or {url}"
        print(f"sparkd {args.command}: cannot reach the daemon at {where}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE


def _control(url: str, args: argparse.Namespace, daemon: DaemonAddress, unix: str | None) -> int:
    headers = {}
    token_file = daemon.control_token_file
    if token_file is not None:
        from pathlib import Path

        from sparkd.shell.secrets import SecretFileError, read_secret

        try:
            token = read_secret(Path(token_file))
        except SecretFileError as exc:
            print(f"sparkd {args.command}: {exc}", file=sys.stderr)
            return EX_NOPERM
        headers["Authorization"] = f"Bearer {token}"
    body: dict[str, Any] = {"by": getpass.getuser()}
    if args.command == "pause":
        body["reason"] = args.reason
        if args.duration:
            from sparkd.model.duration import parse_duration

            try:
                body["for_seconds"] = parse_duration(args.duration)
            except ValueError as exc:
                print(f"sparkd pause: {exc}", file=sys.stderr)
                return EX_USAGE
    name = urllib.parse.quote(args.cluster, safe="")
    verb = args.command
    if verb == "rollout":
        verb = f"rollout/{args.rollout_command}"
    status, raw = _request(
        url, "POST", f"/clusters/{name}/{verb}", json.dumps(body).encode(), headers, unix
    )
    text = raw.decode("utf-8", "replace")
    if status != 200:
        print(f"sparkd {args.command}: HTTP {status}: {text}", file=sys.stderr)
        return 1
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("persisted") is False:
        print(f"sparkd {args.command}: {answer.get('warning')}", file=sys.stderr)
    print(f"{args.cluster}: {verb.replace('/', ' ')} done")
    return 0


def print_rollouts(body: dict[str, Any], cluster: str | None, as_json: bool) -> int:
    clusters = [c for c in body.get("clusters", []) if cluster in (None, c.get("cluster"))]
    if cluster is not None and not clusters:
        print(f"sparkd rollout status: no cluster named {cluster!r}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({c["cluster"]: c.get("rollout") for c in clusters}, indent=2))
        return 0
    for entry in clusters:
        print("\n".join(rollout_lines(entry, always=True)))
    return 0


def rollout_lines(cluster: dict[str, Any], always: bool = False) -> list[str]:
    """`CLUSTER: desired X, running Y, last-good Z`, what differs, and the latest rollout; for
    `sparkd status`, only while the desired spec is not the last-good one (a rollout on, held,
    or failed)."""
    state = cluster.get("rollout") or {}
    latest = state.get("latest") or {}
    settled = state.get("desired") == (state.get("last_good") or {}).get("spec")
    if not always and (settled or not state.get("last_good")):
        return []
    good = (state.get("last_good") or {}).get("spec", "none")
    lines = [
        f"{cluster.get('cluster')}: desired {state.get('desired')}, running "
        f"{state.get('running') or '-'}, last-good {good}"
    ]
    lines.extend(f"  differs: {d}" for d in state.get("differs") or [])
    if latest:
        text = f"  rollout {latest.get('id')}: {latest.get('from')} -> {latest.get('to')}, "
        text += str(latest.get("result"))
        if latest.get("downtime_seconds") is not None:
            text += f", downtime {latest['downtime_seconds']:.0f}s"
        if latest.get("rolled_back"):
            text += f" ({latest['rolled_back']})"
        lines.append(text)
    return lines


def _bar(percent: float | None) -> str:
    if percent is None:
        return ""
    filled = round(BAR * max(0.0, min(100.0, percent)) / 100)
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {percent:.0f}%"


def _ratio(cluster: dict[str, Any]) -> str:
    probes = cluster.get("probes") or {}
    ratio = probes.get("reasoning_only_ratio")
    if ratio is None:
        return "-"
    return f"{100 * ratio:.0f}% of {probes.get('window', 0)}"


def render_status(body: dict[str, Any]) -> str:
    rows = [("CLUSTER", "PHASE", "GPUS", "MODEL", "PROBE", "REASONING-ONLY", "REASON")]
    for cluster in body.get("clusters", []):
        snapshot = cluster.get("snapshot") or {}
        ray = snapshot.get("ray") or {}
        gpus = f"{ray.get('gpus_total', 0):g}" if ray and not ray.get("error") else "-"
        serve = snapshot.get("serve") or {}
        endpoint = snapshot.get("endpoint") or {}
        if cluster.get("phase") == "loading":
            progress = serve.get("progress") or {}
            model = _bar(progress.get("percent")) or progress.get("stage", "loading")
        elif endpoint.get("status") == "up":
            model = (
                "serving"
                if endpoint.get("health_status") == 200
                else f"HTTP {endpoint.get('health_status')}"
            )
        else:
            model = "running" if serve.get("running") else "down"
        # The probe of this cycle, else the latest one: probes run less often than cycles.
        probe = snapshot.get("probe") or (snapshot.get("memory") or {}).get("last_probe") or {}
        verdict = probe.get("verdict") or {}
        latency = probe.get("latency_seconds")
        probe_text = verdict.get("outcome", "-")
        if latency is not None:
            probe_text += f" {latency:.2f}s"
        phase = cluster.get("phase") or "-"
        if cluster.get("paused"):
            phase += " (paused)"
        triage = [str(t) for t in cluster.get("triage") or []]
        if triage:
            phase += f" [{','.join(triage)}]"
        rows.append(
            (
                cluster["cluster"],
                phase,
                gpus,
                model,
                probe_text,
                _ratio(cluster),
                cluster.get("reason", ""),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(6)]
    lines = []
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row[:6], widths, strict=True)]
        lines.append("  ".join([*cells, str(row[6])]))
    for cluster in body.get("clusters", []):
        lines.extend(rollout_lines(cluster))
    lines.extend(_ha_lines(body.get("ha")))
    return "\n".join(lines)


def _ha_lines(ha: Any) -> list[str]:
    """`ha: <instance> (etcd ...)` and one line per cluster: owner, standby or no etcd."""
    if not isinstance(ha, dict):
        return []
    lines = [f"ha: instance {ha.get('instance')}, etcd {ha.get('etcd')} ({ha.get('endpoint')})"]
    for name, claim in (ha.get("clusters") or {}).items():
        role = claim.get("role", "-")
        if role == "owner":
            detail = f" (token {claim.get('token')})"
        elif claim.get("holder"):
            detail = f" (owner: {claim.get('holder')})"
        else:
            detail = ""
        lines.append(f"  {name}: {role}{detail}")
    return lines
