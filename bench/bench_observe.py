"""`observe`: one observe cycle of a 2-host cluster, sparkd in-process over warm connections, vs
`ansible-playbook` running the same fact script on the same hosts (ControlPersist and pipelining
on, no fact gathering, `raw`: Ansible at its best), alternated; the ratio per pair and its median.
sparkd's cycle also reads the model's /health, /v1/models and /metrics; Ansible's does not."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import (
    Counting,
    SimWorld,
    median,
    own_cpu,
    sim_world,
    table,
    wait_healthy,
    write_result,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.shell import catalogue
from sparkd.shell.observe import observe, tool_timeout
from sparkd.shell.ssh import SshPool

ANSIBLE_BIN = Path(__file__).resolve().parent.parent / ".venv-bench" / "bin"


def ansible_setup(world: SimWorld, cluster: ClusterSpec, work: Path) -> list[str]:
    """An inventory, a playbook and an ansible.cfg in `work`; returns the command to run."""
    scripts = work / "scripts"
    scripts.mkdir()
    hosts = []
    for host in cluster.hosts:
        script = catalogue.reads.fact_script(cluster, host, tool_timeout(cluster))
        (scripts / f"{host.name}.sh").write_text(script.command)
        hosts.append(
            f"{host.name} ansible_host={host.address} ansible_port={host.port} "
            f"ansible_user={cluster.ssh.user}"
        )
    (work / "inventory.ini").write_text("[sparks]\n" + "\n".join(hosts) + "\n")
    (work / "facts.yml").write_text(
        "- hosts: sparks\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: facts\n"
        "      ansible.builtin.raw: \"{{ lookup('file', 'scripts/' + inventory_hostname + "
        "'.sh') }}\"\n"
        "      changed_when: false\n"
    )
    control = Path(tempfile.mkdtemp(prefix="bench-cp-"))  # short: a socket path limit
    (work / "ansible.cfg").write_text(
        "[defaults]\n"
        "host_key_checking = True\n"
        "forks = 10\n"
        "interpreter_python = auto_silent\n"
        "retry_files_enabled = False\n"
        "stdout_callback = default\n"
        "[ssh_connection]\n"
        "pipelining = True\n"
        f"control_path_dir = {control}\n"
        "ssh_args = -o ControlMaster=auto -o ControlPersist=300s "
        f"-o UserKnownHostsFile={cluster.ssh.known_hosts_file} "
        f"-o IdentityFile={cluster.ssh.key_file} -o IdentitiesOnly=yes "
        "-o PreferredAuthentications=publickey\n"
    )
    return [str(ANSIBLE_BIN / "ansible-playbook"), "-i", "inventory.ini", "facts.yml"]


async def run_ansible(command: list[str], work: Path) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(work / "ansible.cfg"), "PATH": os.environ["PATH"]}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=work,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    elapsed = time.perf_counter() - started
    if process.returncode != 0 or b"ok=1" not in out:
        raise RuntimeError(f"ansible-playbook failed:\n{out.decode()[-2000:]}")
    return elapsed


async def main(quick: bool = False) -> None:
    runs = 3 if quick else 7
    if not (ANSIBLE_BIN / "ansible-playbook").exists():
        raise RuntimeError("ansible-core is not installed in .venv-bench (make bench does that)")
    async with sim_world("healthy") as world:
        await wait_healthy(world)
        cluster = world.settings.clusters[0]
        pool = SshPool()
        work = Path(tempfile.mkdtemp(prefix="sparkd-bench-ansible-"))
        try:
            command = ansible_setup(world, cluster, work)

            def no_probe(endpoint: object) -> bool:
                return False

            await observe(cluster, pool, probe_due=no_probe)  # warm: connections up
            await run_ansible(command, work)  # warm: ControlPersist masters up
            pairs = []
            with Counting() as counting:
                for _ in range(runs):
                    before = counting.snapshot()
                    cpu = own_cpu()
                    started = time.perf_counter()
                    observed = await observe(cluster, pool, probe_due=no_probe)
                    sparkd_s = time.perf_counter() - started
                    cpu = own_cpu() - cpu
                    after = counting.snapshot()
                    assert all(h.reachable for h in observed.hosts)
                    ansible_s = await run_ansible(command, work)
                    pairs.append(
                        {
                            "sparkd_s": sparkd_s,
                            "sparkd_cpu_s": cpu,
                            "ansible_s": ansible_s,
                            "ratio": ansible_s / sparkd_s,
                            "connects": after[0] - before[0],
                            "execs": after[1] - before[1],
                            "channels": after[2] - before[2],
                        }
                    )
        finally:
            await pool.close()
            shutil.rmtree(work, ignore_errors=True)
    summary = {
        "sparkd_s": median([p["sparkd_s"] for p in pairs]),
        "ansible_s": median([p["ansible_s"] for p in pairs]),
        "ratio": median([p["ratio"] for p in pairs]),
        "sparkd_cpu_per_host_ms": 1000 * median([p["sparkd_cpu_s"] for p in pairs]) / 2,
        "execs_per_host": median([p["execs"] for p in pairs]) / 2,
        "new_connections": max(p["connects"] for p in pairs),
        "http_channels": median([p["channels"] for p in pairs]),
    }
    rows: list[list[object]] = [
        [i + 1, p["sparkd_s"] * 1000, p["ansible_s"] * 1000, p["ratio"], p["execs"], p["connects"]]
        for i, p in enumerate(pairs)
    ]
    rows.append(
        [
            "median",
            summary["sparkd_s"] * 1000,
            summary["ansible_s"] * 1000,
            summary["ratio"],
            "",
            "",
        ]
    )
    text = table(
        "observe: one cycle of 2 hosts, sparkd (warm) vs ansible-playbook (ControlPersist, "
        "pipelining, raw)",
        ["pair", "sparkd ms", "ansible ms", "ratio", "ssh execs", "new conns"],
        rows,
    )
    text += (
        f"\nsparkd CPU per host-observation: {summary['sparkd_cpu_per_host_ms']:.2f} ms; "
        f"SSH execs per host per cycle: {summary['execs_per_host']:g}; "
        f"new connections in steady state: {summary['new_connections']}; "
        f"model HTTP channels per cycle: {summary['http_channels']:g}"
    )
    write_result("observe", {"runs": runs, "pairs": pairs, "summary": summary}, text)
