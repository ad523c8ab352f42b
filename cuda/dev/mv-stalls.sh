#!/usr/bin/env bash
# Why the decode mat-vec kernels run at 20-40% of the read floor, in one device call: ncu
# durations of the gate/up, mat-vec and down kernels on the full S 2.1 Q4_K_M (66 GB) and on
# an 8-layer cut of it (11 GB: if the kernels run much faster there, address translation over
# the large working set is a suspect), then ncu's SpeedOfLight / memory / warp-stall / occupancy
# sections for one launch of each. Stage bench and synth first; carry [".device"].
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
full=/dev/shm/s21-q4km.gguf
small=/dev/shm/s21-8l.gguf
[ -f "$full" ] || .device/bin/synth --preset s-2.1 --types q4_k_m --threads 16 --out "$full" > /dev/null 2>&1
[ -f "$small" ] || .device/bin/synth --preset s-2.1 --layers 8 --types q4_k_m --threads 16 --out "$small" > /dev/null 2>&1
lap "models ready"
kern='regex:moe_gate_up_q_q4_K|mv_q4_K|moe_down_q_q4_K|mv_f32|route_block|attention_decode'
for m in "$full" "$small"; do
  timeout 120 ncu --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --page raw \
    -k "$kern" --launch-skip 40 --launch-count 40 .device/bin/bench --model "$m" --device cuda -p 0 -n 3 -d 0 -r 1 --no-warmup > "$out/dur-$(basename "$m" .gguf).csv" 2>/dev/null
  lap "durations $(basename "$m")"
done
for k in moe_gate_up_q_q4_K mv_q4_K moe_down_q_q4_K mv_f32 route_block attention_decode; do
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --cache-control none --clock-control none \
    -k "regex:^$k\$" --launch-skip 8 --launch-count 1 .device/bin/bench --model "$full" --device cuda -p 0 -n 2 -d 0 -r 1 --no-warmup \
    > "$out/sections-$k.txt" 2>&1
  lap "sections $k"
done
