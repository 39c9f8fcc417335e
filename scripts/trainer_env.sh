#!/usr/bin/env bash
# Make (once, cached) an environment holding one RL trainer's own package, for the tests
# that drive rmgate with that trainer's code. Usage: scripts/trainer_env.sh trl|verl|openrlhf
# Prints the environment's python (trl, verl) or its package folder (openrlhf).
#
# Each trainer venv is an overlay on .venv: a .pth file adds .venv's site-packages after the
# venv's own with site.addsitedir (which also runs .venv's own .pth files, so the editable
# rmgate install is importable from any directory), so torch (2.13.0+cpu), transformers and the rest are reused, and only what the
# trainer needs beyond them (or pins differently, e.g. verl's transformers<5.11) is installed
# into it. The main install stays lean; nothing here is imported by rmgate itself.
#
# verl's overlay is made without a pip of its own (.venv's pip installs into it with
# --python): a second pip and setuptools would only shadow .venv's and cost seconds.
# Rebuilt when this file changes (its hash is the stamp); a half-built env has no stamp and is
# rebuilt. Concurrent callers wait on a lock instead of building the same env twice.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: scripts/trainer_env.sh trl|verl|openrlhf}"
base_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
root=".venv-trainers/$name"
nodeps=()  # installed without their declared dependencies (see each case)
case "$name" in
  trl) pins=("trl==1.16.0") ;;
  verl)
    # verl 0.9.1 with all its dependencies brings ray[default], datasets, pandas, pyarrow,
    # wandb, tensorboard, peft, accelerate, torchdata, hydra-core and more (hundreds of MB;
    # .venv already has ray 2.60). The tests use only its reward loop
    # (verl.experimental.reward_loop), whose imports need, beyond .venv: tensordict (via
    # verl.protocol), omegaconf and codetiming. transformers: verl 0.9.1 declares
    # >=5.5.3,!=5.6.0,<5.11 and its vllm/sglang/cpu extras pin 5.9.0, so the overlay gets
    # 5.9.0 rather than running verl on .venv's 5.19.
    # So: everything --no-deps, as one exact, closed list (no resolver run: -10 s), namely
    # verl, those four, and what they require that .venv lacks or has at a version they
    # refuse: transformers 5.9.0 -> tokenizers<=0.23.0, huggingface-hub<2 (.venv: 0.23.3,
    # 2.4.0); tensordict -> pyvers<0.2 (-> packaging<26), orjson, importlib-metadata (-> zipp,
    # lazy-importer). Found with `pip install --dry-run --report` against the overlay.
    # Measured (2 busy cores): 24-50 s, pip cache cold or warm (unpacking dominates); 147 MB.
    nodeps=("verl==0.9.1" "transformers==5.9.0" "tokenizers==0.22.2" "huggingface-hub==1.33.0"
            "tensordict==0.10.0" "pyvers==0.1.0" "packaging==25.0" "orjson==3.13.0"
            "importlib-metadata==10.2.0" "zipp==4.1.2" "lazy-importer==0.1.0"
            "omegaconf==2.4.0" "codetiming==1.4.0")
    pins=()
    ;;
  openrlhf)
    # openrlhf pins flash-attn (no CPU build), deepspeed, ray 2.55 and transformers 5.15: its
    # wheel alone, no dependencies, in a folder of its own. The tests load
    # openrlhf/utils/agent.py from it (aiohttp and the stdlib, both in .venv) with .venv's
    # python. Measured: 1-9 s, 1.8 MB.
    nodeps=("openrlhf==0.11.2")
    pins=()
    ;;
  *) echo "unknown trainer: $name" >&2; exit 2 ;;
esac
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
stamp="$root/.rmgate-trainer-env"
want="$(cat scripts/trainer_env.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  [ "$name" = openrlhf ] && echo "$PWD/$root/pkgs" || echo "$PWD/$root/bin/python"
  exit 0
fi
rm -rf "$root"
# --no-warn-conflicts: pip would list verl's (deliberately) missing dependencies and how
# .venv's vllm sees the overlay's transformers; neither matters to the code run here.
pip=(.venv/bin/python -m pip --disable-pip-version-check --no-input -q)
start=$SECONDS
if [ "$name" = openrlhf ]; then
  "${pip[@]}" install --no-warn-conflicts --no-deps --target "$root/pkgs" "${nodeps[@]}" >&2
elif [ "$name" = trl ]; then
  .venv/bin/python -m venv "$root"
  site="$("$root/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$base_site')" > "$site/_rmgate_base.pth"
  "$root/bin/python" -m pip --disable-pip-version-check install -q "${pins[@]}" >&2
else
  .venv/bin/python -m venv --without-pip "$root"
  site="$("$root/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$base_site')" > "$site/_rmgate_base.pth"
  if [ "${#nodeps[@]}" -gt 0 ]; then
    "${pip[@]}" --python "$root/bin/python" install --no-warn-conflicts --no-deps "${nodeps[@]}" >&2
  fi
  if [ "${#pins[@]}" -gt 0 ]; then
    "${pip[@]}" --python "$root/bin/python" install --no-warn-conflicts "${pins[@]}" >&2
  fi
fi
echo "trainer_env: built $root in $((SECONDS - start)) s ($(du -sh "$root" | cut -f1))" >&2
echo "$want" > "$stamp"
[ "$name" = openrlhf ] && echo "$PWD/$root/pkgs" || echo "$PWD/$root/bin/python"
