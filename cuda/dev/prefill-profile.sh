#!/usr/bin/env bash
# One device call for prefill work: the tensor-core device tests, a full-size S 2.1 Q4_K_M
# checkpoint made there (kept in /dev/shm while the machine stays warm), `bench` prefill with
# the environment settings in VARIANTS interleaved (default: `gemm.cu` for every product
# against the `gemm_rf.cu` default), where one 2048-token step's kernel time goes
# (`--profile-prefill`), and ncu on the rf kernels (speed of light, warp states, stall
# reasons, instructions per launch). Stage first:
#   ../shared/device/stage.sh tests -p lagoon-cuda && ../shared/device/stage.sh example bench synth
# then run `cuda/dev/prefill-profile.sh` with carry [".device"]. Logs land in $OUT.
# SKIP_TESTS=1 leaves the tests out; NCU=0 leaves ncu out; TYPES below; KERNEL is ncu's kernel regex
# (default gemm_rf_q4_K); MODEL a checkpoint path. Other A/B switches for VARIANTS:
# LAGOON_CUDA_GEMM_H16=0|1 (gemm_h.cu for the dense products), LAGOON_CUDA_GEMM_WG=0|1
# (the wgmma Q4_K kernels).
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# TYPES: the synth type mix (q4_k_m, or int4-g32 for the W4A16 directory: then e.g.
# VARIANTS="LAGOON_CUDA_RF_CT4=0 LAGOON_CUDA_RF_CT4=1 LAGOON_CUDA_RF_CT4=0 LAGOON_CUDA_RF_CT4=1"
# KERNEL=gemm_gate_up_rf_ct4).
types=${TYPES:-q4_k_m}
if [ "$types" = int4-g32 ]; then model=${MODEL:-/dev/shm/s21-int4}; else model=${MODEL:-/dev/shm/s21-q4km.gguf}; fi
[ -e "$model" ] || (.device/bin/synth --preset s-2.1 --types "$types" --threads 16 --out "$model" > "$out/synth.log" 2>&1 &)
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 200 .device/bin/test-tensor_core --include-ignored --nocapture > "$out/tests.log" 2>&1
  lap "tensor-core tests rc=$?"
  grep -E "test result|FAILED|panicked" "$out/tests.log" | head -20
fi
while pgrep -x synth > /dev/null; do sleep 2; done
lap "synth done"
for v in ${VARIANTS:-LAGOON_CUDA_GEMM_RF=0 LAGOON_CUDA_GEMM_RF=1 LAGOON_CUDA_GEMM_RF=0 LAGOON_CUDA_GEMM_RF=1}; do
  echo "== $v"
  env "$v" timeout 120 .device/bin/bench --model "$model" --device cuda -p 512,4096 -n 0 -ub 2048 -r 2 2>&1 \
    | grep -E "^\| .*pp"
  lap "bench $v"
done
timeout 100 .device/bin/bench --model "$model" --device cuda -p 2048 -n 0 -ub 2048 -r 1 --profile-prefill 2048 \
  2>&1 | grep -E "^\| |prefill step" | head -24
lap "profile"
[ "${NCU:-1}" = 0 ] && exit 0
timeout 200 ncu -k "regex:${KERNEL:-gemm_rf_q4_K}" -c 1 --section SpeedOfLight --section WarpStateStats \
  --section Occupancy --section ComputeWorkloadAnalysis \
  --metrics smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio \
  .device/bin/bench --model "$model" --device cuda -p 2048 -n 0 -ub 2048 -r 1 --no-warmup > "$out/ncu.txt" 2>&1
lap "ncu rc=$?"
grep -E "\(.*\)x\(|Duration|SM Frequency|Issue Slots|Warp Cycles Per Issued|Achieved Active Warps|inst_executed|hmma|stalled" "$out/ncu.txt" | head -30
