#!/usr/bin/env bash
# Decode variants alternating on one device call, one line a run: the kernels' lab switches
# (LAGOON_CUDA_DEFINES) or any environment, compared in rounds on a synth S 2.1 checkpoint made
# on the device. What sessions 38-39 wrote by hand in .device/scratch each call.
#   ../shared/device/stage.sh example bench synth
#   run: TYPES=int4-g32 ROUNDS=2 LIMIT=540 cuda/dev/define-sweep.sh "" "DOWN_BATCH=3" "H_BATCH=4,DOWN_BATCH=3"
# (carry [".device"]). Each argument is one variant: a LAGOON_CUDA_DEFINES value (comma-
# separated defines), or `env:A=1,B=2` for environment settings; "" is the defaults. The first
# run of a fresh machine also compiles every kernel (~100 s for W4A16) and each new define set
# recompiles the sources that mention it (~40 s), so a round of N variants costs ~50 s each
# the first time and ~18 s after. Stops starting runs after LIMIT seconds (default 540).
# Output: `[variant] t/s  % of floor  floor GB/s`, then the lap time.
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
types=${TYPES:-int4-g32}
preset=${PRESET:-s-2.1}
# The model in /dev/shm, made when missing (shm-model.sh; MODEL: a checkpoint instead).
. "$(dirname "$0")/shm-model.sh"
shm_model "$types" "$preset" "$out/synth.log"
lap "model $model"
[ $# -gt 0 ] || set -- ""
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in "$@"; do
    [ $(( $(date +%s) - t0 )) -gt "${LIMIT:-540}" ] && { echo "out of time (round $round)"; exit 0; }
    case "$v" in
      env:*) envs=${v#env:}; defs="" ;;
      *) envs=""; defs=$v ;;
    esac
    # ${envs//,/ } splits on purpose: one word per setting.
    # shellcheck disable=SC2086
    env LAGOON_CUDA_DEFINES="$defs" ${envs//,/ } timeout 170 .device/bin/bench --model "$model" --device cuda \
      -p 0 -n 64 -d "${DEPTH:-0}" -r 3 > "$out/run.txt" 2>&1
    floor=$(grep -oE "floor: [0-9.]+ GB/s" "$out/run.txt" | tail -1 | grep -oE "[0-9.]+")
    grep -E "^\| .*\| tg64" "$out/run.txt" | awk -F'|' -v v="$v" -v f="$floor" '{printf "[%s] %s t/s %s of floor %s GB/s\n", v, $9, $13, f}'
    grep -qE "^\| .*\| tg64" "$out/run.txt" || { echo "[$v] no result:"; tail -3 "$out/run.txt"; }
    lap "round $round: $v"
  done
done
