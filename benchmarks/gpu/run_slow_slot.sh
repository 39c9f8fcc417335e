#!/usr/bin/env bash
# The slow-slot benchmark (python -m benchmarks.slow_slot --gpu) as one device call, after the staging
# of ../shared/gpu/README.md and with .gpu-stage/extra carried (benchmarks/gpu/README.md, step 2:
# the wheels vLLM's OpenAI server imports beyond that staging): one kind per call (a call may run 10 minutes), the report, the
# plot, the log and the tail of rmgate's serve log copied to $OUT.
#
#   bash benchmarks/gpu/run_slow_slot.sh disrm --requests 1000 --c1-requests 100 --rounds 3
#   bash benchmarks/gpu/run_slow_slot.sh grm --requests 400 --c1-requests 40 --no-determinism
set -uo pipefail
kind=$1
shift
. /tmp/gpu-env.sh
bash benchmarks/gpu/device_setup.sh || exit 1
. /tmp/rmgate-env.sh
out=/tmp/slow_slot_$kind
dest=${OUT:-/tmp}
timeout "${SLOW_SLOT_TIMEOUT_S:-540}" python3 -m benchmarks.slow_slot --gpu --kinds "$kind" \
    --load-weight answer_time --out "$out" "$@" > "$dest/slow_slot-$kind.log" 2>&1
rc=$?
cp "$out/slow_slot.json" "$dest/slow_slot-$kind.json" 2>/dev/null
cp "$out/slow_slot.png" "$dest/slow_slot-$kind.png" 2>/dev/null
tail -c 6000 "$out/run/serve.log" > "$dest/serve-$kind.log" 2>/dev/null
echo "slow_slot.py exited $rc"
cut -c1-700 "$dest/slow_slot-$kind.log" | grep -v "^WARNING" | tail -40
exit $rc
