#!/usr/bin/env bash
# scripts/setup.sh: installs what the trainer and its tests need on a fresh
# Debian or Ubuntu machine, and nothing that is already there.
#   build: g++ (with OpenMP), make, OpenBLAS built on OpenMP (cblas), OpenMPI,
#          nlohmann-json (checkpoint indexes)
#   tests: PyTorch for the reference (Debian's python3-torch, CPU only),
#          numpy; matplotlib for scripts/plot_metrics.py;
#          build/hfenv, a virtual environment over the system packages (so
#          Debian's torch 1.13 is used) with transformers, tokenizers and
#          safetensors at pinned versions, for the Hugging Face reference
#          (tests/reference/reference_hf.py) and tests/reference/test_hf.py,
#          and ml_dtypes, NumPy's FP8 formats (tests/reference/test_fp8_grid.py)
# Safe to run again: each package is installed only when missing, and the
# virtual environment is left alone when it already imports the pins.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in make g++ libopenblas-openmp-dev openmpi-bin libopenmpi-dev nlohmann-json3-dev python3 python3-numpy python3-torch python3-matplotlib python3-venv; do
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
# The Hugging Face reference. transformers 4.40.2 is the last line that runs
# on torch 1.13; the others are the versions it was checked with.
HF_PINS="transformers==4.40.2 tokenizers==0.19.1 safetensors==0.4.3 huggingface-hub==0.23.0 regex==2026.11.15 tqdm==4.70.1 filelock==4.2.12 fsspec==2026.9.0 ml_dtypes==0.4.1"
HFENV="$(cd "$(dirname "$0")/.." && pwd)/build/hfenv"
hf_ok() {
  "$HFENV/bin/python" - <<'PYEOF' 2>/dev/null
import torch, transformers, tokenizers, safetensors, ml_dtypes
assert transformers.__version__ == "4.40.2" and tokenizers.__version__ == "0.19.1" and safetensors.__version__ == "0.4.3"
assert ml_dtypes.__version__ == "0.4.1"
from transformers import LlamaForCausalLM, GPT2LMHeadModel
PYEOF
}
if ! hf_ok; then
  echo "setup: making $HFENV (transformers, tokenizers, safetensors, ml_dtypes)"
  /usr/bin/python3 -m venv --system-site-packages "$HFENV"
  # shellcheck disable=SC2086  # the pins are words
  "$HFENV/bin/pip" install -q --disable-pip-version-check $HF_PINS
  hf_ok || { echo "setup: $HFENV does not import transformers with Debian's torch" >&2; exit 1; }
fi
echo "setup: dependencies present"
