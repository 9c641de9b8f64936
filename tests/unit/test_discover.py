"""`sparkd init`'s reading of a hand-made deployment: real `docker inspect` and `docker top`
output (tests/fixtures/docker-real/init.jsonl: docker.io 20.10 engine, Docker CLI 28.2.2) in,
a config draft out that the settings accept and that names where each value came from."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest

from sparkd.cli.commands import dispatch
from sparkd.cli.init import host_port
from sparkd.core.reading import discover
from sparkd.core.reading.discover import HostReads, Options
from sparkd.model.exits import EX_USAGE
from sparkd.settings import load_settings
from sparkd.shell.catalogue import discover as catalogue

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "docker-real" / "init.jsonl"
SECRET = "sk-planted-secret"
OPTIONS = Options(user="aurora", key_file="/etc/sparkd/id_ed25519",
                  known_hosts_file="/etc/sparkd/known_hosts")  # fmt: skip


def _real(prefix: str) -> str:
    for line in REAL.read_text().splitlines():
        record = json.loads(line)
        if record["cmd"].startswith(prefix):
            return str(record["stdout"])
    raise AssertionError(f"no {prefix!r} in {REAL.name}")


INSPECT = _real("docker inspect --type container")
TOP = _real("docker top ray-head")
IMAGE_ENV = _real("docker inspect --type image")
ADDRESSES = json.dumps(
    [
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
        {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "10.1.230.180"}]},
        {"ifname": "enp1s0f0np0", "addr_info": [{"family": "inet", "local": "192.168.200.12"}]},
    ]
)
UNITS = (
    "ssh.service                    enabled enabled\n"
    "vllm-cluster.service           enabled enabled\n"
    "vllm-proxy.service             enabled enabled\n"
    "docker.service                 enabled enabled\n"
)


def test_real_inspect_reads_as_the_containers_it_describes() -> None:
    head, glm = discover.parse_inspect(INSPECT)
    assert head.name == "ray-head" and head.image == "local/sparkd-tier:1"
    assert head.running and head.restart == "unless-stopped"
    assert head.gpus and head.network == "host" and head.ipc == "host"
    assert head.shm_size == 16 << 30
    assert head.mounts == ("/models:/models", "/srv/ro:/ro:ro")
    assert dict(head.env)["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    start = discover.ray_start(head.argv)
    assert start is not None and start.head and start.node_ip == "192.168.200.12"
    assert start.port == 6379
    assert glm.name == "glm-flash" and glm.restart == "always" and not glm.gpus
    # `sh -c 'exec vllm serve ...'`: vLLM's words out of the script.
    serve = discover.vllm_serve(glm.argv)
    assert serve is not None and serve.model == "/models/GLM-4.7-Flash" and serve.port == 30001


def test_the_exec_d_serve_is_read_from_docker_top_and_its_key_is_never_kept() -> None:
    rows = [line.split(None, 1)[1] for line in TOP.splitlines()[1:]]
    serve = next(s for s in map(discover.vllm_serve, (r.split() for r in rows)) if s)
    assert serve.model == "/models/Qwen3.5-122B-A10B-FP8"
    assert (serve.port, serve.tensor_parallel, serve.api_key) == (30000, 2, True)
    assert SECRET not in serve.text and SECRET not in " ".join(serve.extra_args)


def _reads(**changes: object) -> HostReads:
    fields: dict[str, object] = {
        "address": "10.1.230.180",
        "port": 22,
        "inspect": INSPECT,
        "image_env": {"local/sparkd-tier:1": IMAGE_ENV},
        "top": {"ray-head": TOP},
        "gpu_apps": "8292, python3, 90000\n4242, Xorg, 18\n",
        "unit_files": UNITS,
        "addresses": ADDRESSES,
    }
    fields.update(changes)
    return HostReads(**fields)  # type: ignore[arg-type]


def _worker() -> HostReads:
    document = json.loads(INSPECT)
    worker = document[0]
    worker["Name"] = "/ray-worker"
    worker["Args"] = ["start", "--block", "--address=192.168.200.12:6379",
                      "--node-ip-address=192.168.200.13"]  # fmt: skip
    worker["ExecIDs"] = None
    addresses = ADDRESSES.replace("192.168.200.12", "192.168.200.13").replace("180", "181")
    return _reads(address="10.1.230.181", inspect=json.dumps([worker]), top={},
                  gpu_apps="", unit_files="", addresses=addresses)  # fmt: skip


def _load(text: str, tmp_path: Path) -> object:
    path = tmp_path / "sparkd.toml"
    path.write_text(text.replace('"/var/lib/sparkd"', json.dumps(str(tmp_path / "state"))))
    return load_settings(path)


def test_the_draft_describes_the_deployment_and_the_settings_accept_it(tmp_path: Path) -> None:
    text = discover.draft(OPTIONS, [_reads(), _worker()])
    assert SECRET not in text
    settings = _load(text, tmp_path)
    cluster = settings.clusters[0]  # type: ignore[attr-defined]
    assert [(h.role, h.data_ip, h.interface) for h in cluster.hosts] == [
        ("head", "192.168.200.12", "enp1s0f0np0"),
        ("worker", "192.168.200.13", "enp1s0f0np0"),
    ]
    assert cluster.ray.image == "local/sparkd-tier:1" and cluster.ray.shm_size == "16g"
    assert cluster.ray.mounts == ("/models:/models", "/srv/ro:/ro:ro")
    assert cluster.ray.env == {"NCCL_SOCKET_IFNAME": "enp1s0f0np0",
                               "GLOO_SOCKET_IFNAME": "enp1s0f0np0"}  # fmt: skip
    assert cluster.ray.extra_docker_args == ("--ipc=host",)
    assert cluster.model.id == "/models/Qwen3.5-122B-A10B-FP8"
    assert (cluster.model.port, cluster.model.tensor_parallel_size) == (30000, 2)
    assert str(cluster.model.api_key_file) == discover.SUGGESTED_KEY_FILE
    assert cluster.cleanup.units == ("vllm-cluster.service", "vllm-proxy.service")
    assert cluster.cleanup.container_patterns == ("glm-flash",)
    # Where each value came from, in its comment.
    assert 'image = "local/sparkd-tier:1"  # container ray-head: Config.Image' in text
    assert "`--node-ip-address` of ray-head" in text
    assert "VLLM_API_KEY in its env: a secret, left out" in text
    assert "GPU processes outside any container: Xorg" in text


def test_two_candidate_interfaces_are_said_with_the_choices(tmp_path: Path) -> None:
    document = json.loads(INSPECT)
    document[0]["Args"] = ["start", "--block", "--head", "--port=6379"]
    document[0]["Config"]["Env"] = ["PATH=/bin"]
    text = discover.draft(OPTIONS, [_reads(inspect=json.dumps(document))])
    assert "# CHECK: 10.1.230.180: no --node-ip-address in `ray start`; candidates: " in text
    assert "enP7s7=10.1.230.180; enp1s0f0np0=192.168.200.12" in text
    # The guess is the address that is not the SSH one; its interface follows, said so.
    assert 'data_ip = "192.168.200.12"  # CHECK: a guess' in text
    assert 'interface = "enp1s0f0np0"  # CHECK: the interface carrying the guessed data_ip' in text
    tomllib.loads(text)


def test_no_running_deployment_says_so_and_is_not_taken_for_a_config(tmp_path: Path) -> None:
    text = discover.draft(OPTIONS, [_reads(inspect="[]", top={})])
    assert "no running deployment was found" in text
    assert "no `vllm serve` process or container was found" in text
    with pytest.raises(Exception, match="image"):
        _load(text, tmp_path)


def test_what_a_host_says_cannot_break_out_of_a_comment(tmp_path: Path) -> None:
    document = json.loads(INSPECT)
    hostile = 'x\n[daemon]\nlisten = "0.0.0.0:1"\n'
    document[0]["Config"]["Env"].append(f"NCCL_DEBUG={hostile}")
    document[0]["Config"]["Image"] = "img\nlisten=1"
    text = discover.draft(OPTIONS, [_reads(inspect=json.dumps(document)), _worker()])
    document_toml = tomllib.loads(text)
    assert document_toml["daemon"]["listen"] == "127.0.0.1:9810"
    assert document_toml["clusters"][0]["ray"]["env"]["NCCL_DEBUG"] == hostile


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.1.230.180", ("10.1.230.180", 22)),
        ("10.1.230.180:2222", ("10.1.230.180", 2222)),
        ("spark-a.lan", ("spark-a.lan", 22)),
        ("[fd00::5]:2200", ("fd00::5", 2200)),
        ("fd00::5", ("fd00::5", 22)),
        ("10.1.230.180:0", None),
        ("10.1.230.180:http", None),
        ("-oProxyCommand=x", None),
        ("", None),
    ],
)
def test_host_arguments(text: str, parsed: tuple[str, int] | None) -> None:
    assert host_port(text) == parsed


def test_inits_reads_change_nothing_and_quote_what_a_host_named() -> None:
    names = ["ray-head", "x;rm -rf /"]
    reads = [
        catalogue.container_names(5),
        catalogue.inspect_containers(names, 5),
        catalogue.image_env("img:1 $(reboot)", 5),
        catalogue.container_processes("x;rm -rf /", 5),
        catalogue.gpu_processes(5),
        catalogue.unit_files(5),
        catalogue.addresses(5),
    ]
    assert not any(r.mutating for r in reads)
    for remote in reads:
        words = shlex.split(remote.command)
        assert words[:4] == ["timeout", "-k", "2", "5"], remote.command
    assert shlex.split(reads[1].command)[-2:] == names
    assert shlex.split(reads[2].command)[-1] == "img:1 $(reboot)"


def test_init_refuses_a_bad_host_before_reaching_any(capsys: pytest.CaptureFixture[str]) -> None:
    rc = dispatch(["init", "--ssh-user", "aurora", "--key", "/k", "--known-hosts", "/kh",
                   "10.1.230.180", "10.1.230.181:99999"])  # fmt: skip
    assert rc == EX_USAGE
    assert "is not HOST or HOST:PORT" in capsys.readouterr().err


def test_other_secret_options_and_sparkds_own_backend_stay_out_of_extra_args() -> None:
    argv = ["vllm", "serve", "/models/m", "--hf-token", "hf_planted", "--max-model-len", "4096",
            "--distributed-executor-backend", "ray", "--api-key=sk-planted"]  # fmt: skip
    serve = discover.vllm_serve(argv)
    assert serve is not None
    assert serve.extra_args == ("--max-model-len", "4096")
    assert serve.secrets == ("--hf-token",) and serve.api_key and serve.backend is None
    assert "planted" not in serve.text
    top = "PID COMMAND\n8292 " + " ".join(argv) + "\n"
    text = discover.draft(OPTIONS, [_reads(top={"ray-head": top})])
    assert "planted" not in text
    assert "`vllm serve` was given --hf-token: a secret, left out of extra_args" in text
