#!/usr/bin/env bash
# Re-resolve the test environments from their ranges (pyproject.toml, the Makefile's vLLM pins)
# in scratch venvs, through the Makefile's own recipes with no pins, and record what pip chose in
# constraints/dev.txt and constraints/vllm.txt. Run it on purpose (`make constraints`), then
# `make clean test` (or `bash .ci/run` in a fresh clone) before committing the new pins.
set -euo pipefail
cd "$(dirname "$0")/.."
make="${MAKE:-make}"
dev=.venv-pins
vllm=.venv-pins-vllm
trap 'rm -rf "$dev" "$vllm"' EXIT
rm -rf "$dev" "$vllm"
"$make" --no-print-directory VENV="$dev" VLLM_VENV="$vllm" DEV_PINS= BUILD_PINS= VLLM_PINS= \
    "$dev/.installed-realray" "$vllm/.installed"

record() {  # record FILE VENV WHAT: the header, then the venv's distributions but ours
    local out=$1 venv=$2 what=$3
    {
        echo "# pip constraints for $what: what \`make constraints\` resolved on $(date -u +%F)."
        echo "# The Makefile installs with these so that a new release cannot change a passing suite;"
        echo "# users installing sparkd get pyproject.toml's ranges. Do not edit: make constraints."
        # The vllm alias is written by tests/realvllm/vllm_alias.py, not installed; torch's
        # local label (+cpu) names the wheel on this machine kind's disk, which the Makefile's
        # plain 'torch==2.13.0' takes where it lies and PyPI's build elsewhere.
        "$venv/bin/python" -m pip freeze --all --exclude-editable \
            | grep -v '^vllm==' | sed -E 's/^(torch==[^+]+)\+.*/\1/'
    } > "$out.tmp"
    mv "$out.tmp" "$out"
}
record constraints/dev.txt "$dev" "the test venv (.venv: .[dev,realray] and the simulator)"
record constraints/vllm.txt "$vllm" "the real-vLLM tier's venv (.venv-vllm)"
git --no-pager diff --stat -- constraints/ || true
