#!/usr/bin/env bash
# One device call: device tests, a full-size S 2.1 Q4_K_M checkpoint made there (kept in
# /dev/shm while the machine stays warm), `bench` decode with programmatic dependent launch
# off and on (interleaved), then every kernel of a few decode steps timed by ncu
# (gpu__time_duration, caches and clocks left alone) and, when nsys is there, the graph-replayed
# step's timeline (kernel starts and ends, so the gaps between kernels show). Stage first:
#   ../shared/device/stage.sh tests -p lagoon-cuda && ../shared/device/stage.sh example bench synth
# then run `cuda/dev/decode-profile.sh` with carry [".device"]. Logs and CSVs land in $OUT.
# SKIP_TESTS=1 leaves the tests out; BENCH_ONLY=1 leaves ncu/nsys out; TYPES, VARIANTS, KV_AB,
# FULL and TRACE: below.
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "ncu: $(command -v ncu || echo none)  nsys: $(command -v nsys || echo none)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 .device/run-tests.sh --nocapture > "$out/tests.log" 2>&1
  lap "device tests rc=$?"
  grep -E "test result|FAILED|panicked|bitwise" "$out/tests.log" | head -40
fi
# TYPES: the synth type mix (q4_k_m, iq4_xs, ...; int4-g32 and int8 write compressed-tensors
# directories); PRESET: the synth preset (s-2.1; an int8 S 2.1 is ~132 GB, more than
# /dev/shm holds, so take xs-2.1 for int8).
types=${TYPES:-q4_k_m}
preset=${PRESET:-s-2.1}
# MODEL: a checkpoint to bench instead (synth makes it there if it is missing).
. "$(dirname "$0")/shm-model.sh"
shm_model "$types" "$preset" "$out/synth.log"
lap "model $model"
# VARIANTS: environment settings compared, interleaved (default: programmatic launch off/on);
# one variant may set several variables, comma-separated (A=1,B=1).
# (170 s: on a fresh machine the first run also compiles every kernel and loads the model; an
# S 2.1 W4A16 first run took over 100 s in session 38.)
for v in ${VARIANTS:-LAGOON_CUDA_PDL=0 LAGOON_CUDA_PDL=1 LAGOON_CUDA_PDL=0 LAGOON_CUDA_PDL=1}; do
  echo "== $v"
  env ${v//,/ } timeout 170 .device/bin/bench --model "$model" --device cuda -p 0 -n 64 -d ${DEPTHS:-0} -r 3 2>&1 \
    | grep -E "^\||floor" | tail -4
  lap "bench $v"
done
# KV_AB=1: decode at depth 0, 4k and 32k with the f32 and the f16 KV cache, interleaved.
if [ "${KV_AB:-0}" = 1 ]; then
  for kv in f32 f16 f32 f16; do
    echo "== --kv $kv"
    timeout 150 .device/bin/bench --model "$model" --device cuda --kv "$kv" -p 0 -n 64 -d 0,4096,32768 -r 2 2>&1 \
      | grep -E "^\|.*tg" | tail -3
    lap "bench --kv $kv"
  done
fi
# FULL=1: the issue's whole table once (decode at depth 0, 4k, 32k; pp512 and pp4096).
if [ "${FULL:-0}" = 1 ]; then
  timeout 200 .device/bin/bench --model "$model" --device cuda -p 512,4096 -n 64 -d 0,4096,32768 -r 2 -ub 2048 2>&1 \
    | grep -E "^\||floor" > "$out/full.txt"
  cat "$out/full.txt"
  lap "full table"
fi
# TRACE=1: the graph-replayed step's timeline (cuda/src/trace.rs: the kernels compiled with
# their trace hooks, ~4% slower), per kernel and one layer in launch order
# (cuda/dev/trace-summary.py; the trace comes back xz-compressed and the script also runs here).
if [ "${TRACE:-0}" = 1 ]; then
  LAGOON_CUDA_DEFINES="LAGOON_TRACE${LAGOON_CUDA_DEFINES:+,$LAGOON_CUDA_DEFINES}" LAGOON_CUDA_TRACE="$out/decode.trace" \
    timeout 150 .device/bin/bench --model "$model" --device cuda -p 0 -n 32 -d ${DEPTHS:-0} -r 1 2>&1 | grep -E "^\|.*tg|rror"
  command -v python3 > /dev/null && python3 cuda/dev/trace-summary.py "$out/decode.trace" 16 | tee "$out/trace-summary.md"
  xz -T4 "$out/decode.trace"
  lap "trace"
fi
[ "${BENCH_ONLY:-0}" = 1 ] && exit 0
# ncu: every kernel of the run (floor reads, the first token, 3 decode steps); the decode
# steps are the repeating tail.
timeout 200 ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none \
  --csv --page raw --launch-count 4000 \
  .device/bin/bench --model "$model" --device cuda -p 0 -n 3 -d 0 -r 1 --no-warmup \
  > "$out/ncu-decode.csv" 2> "$out/ncu-decode.err"
lap "ncu rc=$? rows=$(wc -l < "$out/ncu-decode.csv")"
# The last decode step's kernels, by total time (cuda/dev/ncu-summary.py; also runs here on
# the fetched CSV).
command -v python3 > /dev/null && python3 cuda/dev/ncu-summary.py "$out/ncu-decode.csv" | tee "$out/ncu-summary.md"
if command -v nsys > /dev/null; then
  timeout 150 nsys profile --cuda-graph-trace=node -t cuda -o /tmp/decode -f true \
    .device/bin/bench --model "$model" --device cuda -p 0 -n 16 -d 0 -r 1 --no-warmup > /dev/null 2>&1
  timeout 60 nsys stats --report cuda_gpu_trace --format csv -o /tmp/decode /tmp/decode.nsys-rep > /dev/null 2>&1
  ls /tmp/decode* ; xz -T4 -c /tmp/decode_cuda_gpu_trace.csv > "$out/nsys-trace.csv.xz" 2>/dev/null
  lap "nsys"
fi
