#!/usr/bin/env bash
# scripts/setup.sh: installs what the trainer and its tests need on a fresh
# Debian or Ubuntu machine, and nothing that is already there.
#   build: g++ (with OpenMP), make, OpenBLAS built on OpenMP (cblas), OpenMPI,
#          nlohmann-json (checkpoint indexes)
#   tests: PyTorch for the reference (Debian's python3-torch, CPU only),
#          numpy; matplotlib for scripts/plot_metrics.py
# Safe to run again: each package is installed only when missing.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in make g++ libopenblas-openmp-dev openmpi-bin libopenmpi-dev nlohmann-json3-dev python3 python3-numpy python3-torch python3-matplotlib; do
  have_pkg "$p" || need+=("$p")
done

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "setup: dependencies present"
