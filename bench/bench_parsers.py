"""`parsers`: the worst case of every parser a host's or a model's output reaches, at the largest
input its cap lets through. A broken or hostile host prints up to the SSH output cap
(`shell.ssh.MAX_OUTPUT`, 8 MiB) in any section of the fact script; the model server and Ray's
dashboard answer up to their body caps (`shell.model_http.MAX_BODY`, `shell.ray_http.MAX_ANSWER`,
1 MiB); etcd up to `ha.etcd.MAX_ANSWER`; a `docker events` line up to the stream's line cap.
Each parser gets each hostile shape (a valid line repeated to the cap, one line that long, only
line breaks, JSON nesting, words) and its CPU is measured on this process (the event loop's
thread: nothing here runs elsewhere); a fact-script section's parser is timed as the look runs
it, behind `parsers.parse_sections`, which hands on no section of more than `SECTION_LINES`
lines. The bound stated: every parse under BOUND seconds of CPU,
well inside the daemon's watchdog (90 s) and one look's budget."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from bench.common import table, write_result
from sparkd.core.judging import acceptance
from sparkd.core.reading import (
    cache_entries,
    classify,
    kernel,
    links,
    parsers,
    ray_json,
    weight_files,
)
from sparkd.ha import etcd
from sparkd.model.cluster import RolloutCheck
from sparkd.shell import model_http, ray_http, ssh
from sparkd.shell.events import parse_event

# What one parse of the worst input at its cap may cost, in CPU seconds on this machine.
BOUND = 1.0
EVENT_LINE = 65536  # shell.ssh.Connection.lines' default max_line, the docker events stream's


def fill(unit: str, cap: int) -> str:
    """`unit` repeated to at most `cap` characters."""
    return unit * max(1, cap // max(1, len(unit)))


def shapes(line: str, cap: int) -> dict[str, str]:
    """The hostile inputs for a parser whose valid line is `line`."""
    return {
        "valid line repeated": fill(line + "\n", cap),
        "one line that long": fill(line, cap),
        "line breaks only": "\n" * cap,
        "JSON nesting": "[" * cap,
        "words": fill("garbage words, ", cap),
    }


KERNEL_LINE = "[ 4410.118204] spark-b kernel: NVRM: Xid (PCI:000f:01:00): 13, pid=1, name=x, Ch 8"
DOCKER_PS = json.dumps(
    {"Names": "sparkd-ray-head", "Image": "nvcr.io/nvidia/vllm:25.09", "State": "running",
     "Labels": "sparkd.role=head,sparkd.cluster=sparks", "Status": "Up 2 hours"}
)  # fmt: skip
CHAT = json.dumps(
    {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."},
                  "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
)  # fmt: skip
RAY_ROW = {"node_id": "a" * 56, "node_ip": "10.0.0.1", "state": "ALIVE",
           "resources_total": {"GPU": 1.0}, "is_head_node": True}  # fmt: skip
METRIC = 'vllm:num_requests_running{engine="0",model_name="m"} 1.0'
CHECK = RolloutCheck(prompt="p", regex=r"^(\w+,?\s?)*\.$")


def through_sections(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A section's parser as the look runs it: on what parse_sections cut out (a section of
    more than SECTION_LINES lines is never handed on)."""

    def run(text: str) -> Any:
        section = parsers.parse_sections(f"@@sparkd s\n{text}\n@@sparkd-end s 0\n").get("s")
        return parse(section.body) if section is not None and section.ok else None

    return run


def ray_nodes(cap: int) -> str:
    row = json.dumps(RAY_ROW)
    rows = ",".join([row] * (cap // (len(row) + 1) - 10))
    return f'{{"data": {{"result": {{"result": [{rows}], "num_filtered": 0}}}}}}'


# name, cap (characters), parser, valid line, extra shapes
Parser = tuple[str, int, Callable[[str], Any], str, dict[str, str]]


def parsers_at_caps() -> list[Parser]:
    out = ssh.MAX_OUTPUT
    body = model_http.MAX_BODY
    sections = "@@sparkd units\nId=x.service\n@@sparkd-end units 0"
    return [
        ("parse_sections (fact script)", out, parsers.parse_sections, sections, {}),
        ("kernel.parse_kernel_log", out, kernel.parse_kernel_log, KERNEL_LINE,
         {"NVRM: on one line": "[ 1.0] " + fill("NVRM:", out)}),
        ("kernel.parse_meminfo", out, kernel.parse_meminfo, "MemTotal: 125488340 kB", {}),
        ("parse_systemctl_show", out, parsers.parse_systemctl_show, "Id=ray.service",
         {"blank runs": fill("\n \n", out)}),
        ("parse_docker_ps", out, parsers.parse_docker_ps, DOCKER_PS,
         {"distinct containers": "".join(
             DOCKER_PS.replace("sparkd-ray-head", f"c{i}") + "\n" for i in range(out // 200))}),
        ("unreadable_container_line", out, parsers.unreadable_container_line, '{"Names"', {}),
        ("parse_docker_top", out, parsers.parse_docker_top, "1234 56 00:00:01 vllm serve m", {}),
        ("parse_compute_apps", out, parsers.parse_compute_apps, "1234, python3, [N/A]", {}),
        ("parse_ip_addr", out, parsers.parse_ip_addr, '[{"ifname":"enp1s0f0np0"}]', {}),
        ("parse_stat_time", out, parsers.parse_stat_time, "2026-11-30 03:18:05.1 +0000", {}),
        ("parse_df_paths", out, lambda t: parsers.parse_df_paths(t, ["/a", "/b"]),
         "df: /a: No such file or directory", {}),
        ("parse_ray_nodes (CLI)", out, parsers.parse_ray_nodes, json.dumps([RAY_ROW]), {}),
        ("parse_ray_status (CLI)", out, parsers.parse_ray_status, " 1 node_" + "a" * 56,
         {"status": "Node status\nActive:\n" + fill(" 1 node_" + "a" * 56 + "\n", out)}),
        ("failure_reason", out, parsers.failure_reason, "Traceback (most recent call last):", {}),
        ("section_log_lines + parse_load_progress", out,
         lambda t: parsers.parse_load_progress(parsers.section_log_lines(t), None),
         "Loading safetensors checkpoint shards:  50% Completed | 1/2",
         {"carriage returns": fill("\r", out)}),
        ("links.parse_fabric", out, lambda t: links.parse_fabric(t, "10.0.0.1"),
         "/sys/class/infiniband/mlx5_0/ports/1/gids/0:fe80:0000:0000:0000:0000:0000:0000:0001",
         {}),
        ("cache_entries.parse_listing", out, cache_entries.parse_listing,
         "1764470285.1 vllm-abc", {}),
        ("weight_files.parse_stat", out, lambda t: weight_files.parse_stat("/m", t, 0), "10 /m/a",
         {}),
        ("weight_files.parse_index", weight_files.REDUCED_LIMIT, weight_files.parse_index,
         '{"weight_map": {"a": "model-00001.safetensors"}}', {}),
        ("ray_json.parse_nodes", ray_http.MAX_ANSWER, ray_json.parse_nodes, "{}",
         {"rows at the cap": ray_nodes(ray_http.MAX_ANSWER)}),
        ("ray_json.parse_cluster_status", ray_http.MAX_ANSWER, ray_json.parse_cluster_status,
         "{}", {}),
        ("classify_response (probe)", body, lambda t: classify.classify_response(200, t, 50),
         CHAT, {"one answer that long": CHAT.replace("Paris.", fill("Paris is ", body - 300))}),
        ("classify_stream (probe)", body,
         lambda t: classify.classify_stream(200, t.splitlines(), 50),
         'data: {"choices":[{"delta":{"content":"a"}}]}', {}),
        ("judge_check (regex)", body, lambda t: acceptance.judge_check(0, CHECK, 200, t), CHAT,
         {"one answer that long": CHAT.replace("Paris.", fill("word, ", body - 300))}),
        ("parse_vllm_metrics", body, model_http.parse_vllm_metrics, METRIC, {}),
        ("docker events line", EVENT_LINE, parse_event, '{"Action":"die"}', {}),
        ("etcd answer (json)", etcd.MAX_ANSWER, _etcd_json, '{"kvs":[]}', {}),
    ]  # fmt: skip


def _etcd_json(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def cpu_of(parse: Callable[[str], Any], text: str, runs: int) -> tuple[float, str]:
    """The least CPU of `runs` parses (the machine's noise only adds), and the exception a
    parse raised ("" when none: what raises is timed to the raise; its caller's handling is
    checked by the unit tests, not here)."""
    best = float("inf")
    raised = ""
    for _ in range(runs):
        started = time.process_time()
        try:
            parse(text)
        except Exception as exc:  # reported beside the time
            raised = type(exc).__name__
        best = min(best, time.process_time() - started)
    return best, raised


async def main(quick: bool = False) -> None:
    runs = 1 if quick else 3
    rows: list[list[Any]] = []
    results: dict[str, dict[str, Any]] = {}
    for name, cap, parse, line, extra in parsers_at_caps():
        if cap == ssh.MAX_OUTPUT and parse is not parsers.parse_sections:
            parse = through_sections(parse)
        timings: dict[str, float] = {}
        raised: dict[str, str] = {}
        for shape, text in {**shapes(line, cap), **extra}.items():
            timings[shape], raised[shape] = cpu_of(parse, text[:cap], runs)
        worst = max(timings, key=lambda s: timings[s])
        results[name] = {"cap": cap, "cpu_seconds": timings, "raised": raised}
        met = all(t < BOUND for t in timings.values())
        rows.append(
            [name, f"{cap >> 10} KiB", worst, timings[worst], "yes" if met else "NO",
             ", ".join(sorted({f"{r} ({s})" for s, r in raised.items() if r}))]
        )  # fmt: skip
    text = table(
        f"worst-case parse at each cap, CPU seconds (least of {runs}); bound {BOUND} s",
        ["parser", "cap", "worst shape", "cpu s", "within bound", "raised"],
        rows,
    )
    print(text)
    write_result("parsers", {"bound_seconds": BOUND, "runs": runs, "parsers": results}, text)
