"""First contact's read (core.judging.adopt): the running containers' config, as `docker inspect
--format` prints it (docker/cli cli/command/inspect: one line per object, Go's text/template with
the `json` function of docker/cli templates/templates.go), with their `docker top` processes."""

from __future__ import annotations

import json

from sparkd.core.reading import parsers
from sparkd.model.sections import FactSection
from sparkd.shell import catalogue
from tests.toy import reference_cluster

# Docker prints `.Name` with its leading slash, and `null` for an unset Entrypoint.
LINE = json.dumps(
    {
        "name": "/ray-head",
        "image": "hellohal2064/vllm-qwen3.5-gb10",
        "env": ["NCCL_SOCKET_IFNAME=enp1s0f0np0", "HF_TOKEN=hf_secret", "PATH=/usr/bin", "EMPTY="],
        "entrypoint": None,
        "cmd": ["bash", "-c", "ray start --head --node-ip-address=192.168.200.12 --block"],
    }
)
SERVE = (
    "/usr/bin/python3 /usr/local/bin/vllm serve /models/Qwen3.5-122B-A10B-FP8 --port 30000 "
    "--api-key sk-verysecret"
)


def test_a_foreign_container_reads_with_its_processes_and_no_secret() -> None:
    top = parsers.TopRow(pid=4242, elapsed=10.0, args=SERVE)
    (box,) = parsers.parse_foreign(LINE + "\nnot json\n", {"ray-head": [top]})
    assert box.name == "ray-head"
    assert box.image == "hellohal2064/vllm-qwen3.5-gb10"
    assert box.env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert box.env["HF_TOKEN"] == parsers.REDACTED
    assert box.env["EMPTY"] == ""
    assert box.command[:2] == ("bash", "-c")
    (process,) = box.processes
    assert process.startswith("4242 /usr/bin/python3 /usr/local/bin/vllm serve /models/")
    assert "sk-verysecret" not in process and f"--api-key {parsers.REDACTED}" in process


def test_secret_options_are_redacted_in_every_spelling() -> None:
    words = ["vllm", "serve", "m", "--api-key=abc", "--hf-token", "def", "--port", "1"]
    assert parsers.redact_words(words) == (
        "vllm", "serve", "m", f"--api-key={parsers.REDACTED}", "--hf-token",
        parsers.REDACTED, "--port", "1",
    )  # fmt: skip
    assert "abc" not in parsers.redact_words(["sh -c 'vllm serve m --api-key abc'"])[0]


def test_the_fact_script_reads_foreign_containers_only_without_its_own() -> None:
    cluster = reference_cluster()
    script = catalogue.reads.fact_script(cluster, cluster.head, 10.0)
    line = next(x for x in script.command.splitlines() if f"s {FactSection.FOREIGN}" in x)
    assert '[ "$e" != running ]' in line
    assert "docker inspect --format" in line and "-- $r" in line
    assert not script.mutating
