#!/usr/bin/env bash
# System packages the CI suite needs beyond the Python venv: Slurm (slurmctld, slurmd, sbatch, ...) and munge,
# for tests/integration/slurm/, and iproute2 (`ip`) for its multi-node cluster of network namespaces. Idempotent: installs only what is missing, and only as root with apt-get;
# otherwise it says why it did nothing (the Slurm test then skips locally, and fails under CI=true).
#
#   bash scripts/install_ci_deps.sh
set -euo pipefail

missing=()
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
    || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nsenter >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1 || missing+=(util-linux)

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "[install_ci_deps] slurm-wlm, munge, iproute2 and util-linux already installed: nothing to do"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "[install_ci_deps] missing ${missing[*]} but not running as root: not installing"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[install_ci_deps] missing ${missing[*]} but apt-get is not available: not installing"
    exit 0
fi

echo "[install_ci_deps] installing ${missing[*]} with apt-get"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent (fresh image) or stale (404 on install): refresh once when the install fails.
apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/install_ci_deps.log 2>&1 \
    || { apt-get update >>/tmp/install_ci_deps.log 2>&1 \
         && apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/install_ci_deps.log 2>&1; } \
    || { tail -n 30 /tmp/install_ci_deps.log; echo "[install_ci_deps] apt-get failed (log above)"; exit 1; }
echo "[install_ci_deps] installed ${missing[*]} in $((SECONDS - start)) s: $(slurmctld -V 2>/dev/null || true)"
