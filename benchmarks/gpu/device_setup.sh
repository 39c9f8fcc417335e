#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, after ../shared/gpu's
# install-on-device.sh and `. /tmp/gpu-env.sh`:
#   1. installs the wheels carried in .gpu-stage/extra/ (what vLLM's OpenAI server imports
#      beyond the staged offline engine; benchmarks/gpu/wheel_list.py computes the list from
#      vLLM's imports: model_hosting_container_standards, prometheus_fastapi_instrumentator,
#      jmespath, supervisor), each only when its distribution is not installed, so nothing
#      shadows a package the image already has;
#   2. writes /tmp/rmgate-env.sh (the checkout and those wheels on PYTHONPATH);
#   3. checks that vLLM's server, rmgate's CLI and the benchmark's imports load, and when one
#      does not, names every missing module (find_missing.py) and stops with status 1.
# Also ends processes a previous call of this session left on the GPU (they outlive a call
# when started in a session of their own: the gateway, Ray, engines).
set -euo pipefail
SRC="${RMGATE_EXTRA_WHEELS:-.gpu-stage/extra}"
EXTRA=/tmp/rmgate-extra
mkdir -p "$EXTRA"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$EXTRA"

left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' || true)
if [ -n "$left" ]; then
  echo "device_setup: ending processes left on the GPU by an earlier call: $left"
  for pid in $left; do kill -9 "$pid" 2>/dev/null || true; done
fi

need=$(python - "$SRC" <<'PY'
import glob, sys, importlib.metadata as m
have = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
for whl in sorted(glob.glob(sys.argv[1] + "/*.whl")):
    name = whl.split("/")[-1].split("-")[0].lower().replace("_", "-")
    if name not in have:
        print(whl)
PY
)
if [ -n "$need" ]; then
  echo "device_setup: installing $(echo "$need" | wc -l) wheels into $EXTRA"
  # shellcheck disable=SC2086
  pip install -q --no-index --no-deps --no-compile --target "$EXTRA" $need
fi
echo "export PYTHONPATH=\"$PWD:\${PYTHONPATH:+\$PYTHONPATH:}$EXTRA\"" > /tmp/rmgate-env.sh
. /tmp/rmgate-env.sh
if ! python -c "import vllm.entrypoints.openai.api_server, gateway.cli, aiohttp, pynvml, benchmarks.gpu.bench_paths" 2>/tmp/rmgate-import.err; then
  tail -5 /tmp/rmgate-import.err
  echo "device_setup: an import failed; the missing modules:"
  python -m benchmarks.gpu.find_missing vllm.entrypoints.openai.api_server gateway.cli benchmarks.gpu.bench_paths || true
  exit 1
fi
python -c "from gateway.serve.proxy_mode import default_proxy; print('device_setup: rmgate deps ok; serve path:', default_proxy())"
