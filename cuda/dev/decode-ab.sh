#!/usr/bin/env bash
# One device call that checks and measures a decode-path change on the GPU machine:
# device tests, a full-size S 2.1 Q4_K_M checkpoint made there, then `bench` decode with
# programmatic dependent launch off and on, interleaved (off, on, off, on), at depth 0 and
# 4096. Stage first, here:
#   ../shared/device/stage.sh tests -p lagoon-cuda && ../shared/device/stage.sh example bench synth
# then run `cuda/dev/decode-ab.sh` through the device tool with carry [".device"].
# Logs land in $OUT (or /tmp when unset). About 6-8 minutes.
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
.device/run-tests.sh > "$out/tests.log" 2>&1
lap "device tests rc=$?"
grep -E "test result|FAILED|panicked|bitwise" "$out/tests.log" | head -40
model=/dev/shm/s21-q4km.gguf
[ -f "$model" ] || .device/bin/synth --preset s-2.1 --types q4_k_m --threads 16 --out "$model" > "$out/synth.log" 2>&1
lap "synth done"
for pdl in 0 1 0 1; do
  echo "== LAGOON_CUDA_PDL=$pdl"
  LAGOON_CUDA_PDL=$pdl .device/bin/bench --model "$model" --device cuda -p 0 -n 64 -d 0,4096 -r 3 2>&1 \
    | grep -E "^\||floor" | tail -3
  lap "bench pdl=$pdl"
done
