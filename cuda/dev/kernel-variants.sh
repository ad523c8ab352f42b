#!/usr/bin/env bash
# Kernel variants of the decode step in one device call: for each LAGOON_CUDA_DEFINES setting
# in DUR_VARIANTS, ncu's duration and instruction count of the kernels matching KERNELS (48
# launches of an 8-layer S 2.1 cut, `synth --layers 8`), then for each setting in VARIANTS
# `bench` tg64 on the full S 2.1 (skipped when VARIANTS is empty), interleaved in the order
# given. PLAIN = no defines. Stage `stage.sh example bench synth`, carry [".device"].
# Example (session 20):
#   DUR_VARIANTS="PLAIN DOWN_Q4K_PAIRS=0" VARIANTS="PLAIN DOWN_Q4K_PAIRS=0 PLAIN DOWN_Q4K_PAIRS=0" \
#     cuda/dev/kernel-variants.sh
set -u
out=${OUT:-/tmp}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
types=${TYPES:-q4_k_m}
m8=/dev/shm/s21-8l-$types.gguf
m=/dev/shm/s-2.1-$types.gguf
kern=${KERNELS:-moe_down_q|moe_gate_up_q}
[ -f "$m8" ] || .device/bin/synth --preset s-2.1 --layers 8 --types "$types" --threads 16 --out "$m8" > /dev/null 2>&1
[ -z "${VARIANTS:-}" ] || [ -f "$m" ] || .device/bin/synth --preset s-2.1 --types "$types" --threads 16 --out "$m" > /dev/null 2>&1
lap "models"
i=0
for v in ${DUR_VARIANTS:-PLAIN}; do
  i=$((i + 1))
  if [ "$v" = PLAIN ]; then unset LAGOON_CUDA_DEFINES; else export LAGOON_CUDA_DEFINES="$v"; fi
  # The first run compiles (and caches) the variant's PTX outside ncu.
  .device/bin/bench --model "$m8" --device cuda -p 0 -n 8 -r 1 > /dev/null 2>&1
  timeout 100 ncu --metrics gpu__time_duration.sum,sm__inst_executed.sum --cache-control none --clock-control none \
    --csv --page raw -k "regex:$kern" --launch-skip 16 --launch-count 48 \
    .device/bin/bench --model "$m8" --device cuda -p 0 -n 6 -d 0 -r 1 --no-warmup > "$out/dur-$i.csv" 2> /dev/null
  echo "$v" > "$out/dur-$i.name"
  lap "durations $v"
done
python3 - "$out" << 'PY'
import collections, csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + '/dur-*.csv')):
    rows = [r for r in csv.reader(open(f)) if len(r) > 10]
    if not rows:
        continue
    h = rows[0]
    name = h.index('Kernel Name')
    agg = collections.defaultdict(list)
    dur = h.index('gpu__time_duration.sum')
    for r in rows[1:]:
        # Skip the units row (its duration cell is a unit, not a number).
        if r[name] and r[dur].replace(',', '').replace('.', '', 1).isdigit():
            agg[r[name]].append(r)
    print(open(f[:-4] + '.name').read().strip())
    for k, v in sorted(agg.items()):
        def avg(col):
            try:
                return sum(float(x[h.index(col)].replace(',', '')) for x in v) / len(v)
            except ValueError:
                return float('nan')
        print(f"  {k:32s} n={len(v):3d} ns={avg('gpu__time_duration.sum'):9.1f} inst={avg('sm__inst_executed.sum'):10.0f}")
PY
for v in ${VARIANTS:-}; do
  echo "== $v"
  if [ "$v" = PLAIN ]; then unset LAGOON_CUDA_DEFINES; else export LAGOON_CUDA_DEFINES="$v"; fi
  timeout 100 .device/bin/bench --model "$m" --device cuda -p 0 -n 64 -d 0 -r 3 2>&1 | grep -E "tg64|floor"
  lap "bench $v"
done
