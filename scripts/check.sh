#!/usr/bin/env bash
# Lint, format and type checks, as CI runs them (part of the README's test command):
#   ruff check and ruff format --check over gateway/, deployments/, tests/, benchmarks/;
#   mypy over gateway/ and deployments/ (strict on the pure core, gateway/core: pyproject.toml).
# Exits non-zero when any fails; prints each one's time.
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
paths=(gateway deployments tests benchmarks)
step() {
  local name=$1; shift
  local t0=$EPOCHREALTIME
  "$@" || rc=1
  awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "check: %s %.1f s\n", n, b - a }' 
}
step "ruff check" .venv/bin/ruff check --no-cache "${paths[@]}"
step "ruff format --check" .venv/bin/ruff format --check --no-cache "${paths[@]}"
step "mypy" .venv/bin/mypy
exit "$rc"
