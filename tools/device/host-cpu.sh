#!/usr/bin/env bash
# One device call for issue #5's figures on the GPU machine's 16-core host, CPU only:
# builds llama.cpp's llama-bench from .device/llama.cpp.tar.xz (tools/device/stage-llamacpp.sh),
# writes a full-size XS 2.1 Q4_K_M checkpoint with synth, then runs lagoon's bench and
# llama-bench on that same file, alternately, and the expert-kernel criterion benches when
# .device/bin/kernels-bench is staged. Stage here first (the call carries at most 64 MiB with
# the working tree, so leave the test binaries out):
#   ../shared/device/stage.sh clean && ../shared/device/stage.sh example bench synth
#   tools/device/stage-llamacpp.sh
#   k=$(cargo bench -p lagoon-cpu --bench kernels --no-run 2>&1 | grep -o 'target/[^ )]*kernels-[0-9a-f]*')
#   cp "$k" .device/bin/kernels-bench && strip --strip-debug .device/bin/kernels-bench
# then run `tools/device/host-cpu.sh` through the device tool with carry [".device"].
# THREADS (16), MODEL (/dev/shm/xs21-q4km.gguf) and SYNTH (its synth arguments) override the
# defaults, e.g. for a dry run on a small machine. VARIANTS: environment settings lagoon's
# bench runs under, one run each per round (e.g. "LAGOON_CPU_X8=0 LAGOON_CPU_X8=1"; default
# one plain run); KINDS: the kernel benches' LAGOON_BENCH_KINDS (e.g. q4_K); KVARIANTS,
# KROUNDS, KFILTER: below. ROUNDS (2); TESTS: a staged test binary and its filter, run first
# (e.g. "test-lagoon_cpu x8"); BENCH_ARGS: lagoon bench's test arguments (default "-p 512
# -n 128 -r 3"; add "--profile 32" for the node table of 32 decode steps); PAIRS=N: the
# paired-floor GEMV of KINDS first (KROUNDS=0 then skips the criterion runs).
# MIXES="q4_0 q2_k ...": instead of one MODEL, one synth checkpoint per mix (PRESET, default
# xs.2, at LAYERS layers, default 8; made in /dev/shm, compared ROUNDS times, then removed).
# Logs in $OUT (or /tmp). About 7 minutes (MIXES: ~40 s a mix at 8 layers on 16 threads).
set -u
out=${OUT:-/tmp}
threads=${THREADS:-16}
model=${MODEL:-/dev/shm/xs21-q4km.gguf}
synth_args=${SYNTH:---preset xs-2.1 --types q4_k_m}
t0=$(date +%s)
lap() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
lscpu | grep -E "Model name|^CPU\(s\)|per core|per socket|Socket|NUMA node\(s\)|L[23] cache|MHz"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  set -- $TESTS
  ".device/bin/$1" "${@:2}" 2>&1 | tee "$out/tests.log" | grep -E "^test |test result" | tail -30
  lap "tests"
fi
lb=$(find /tmp/llama.cpp/build -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)
# (Built while synth writes the checkpoint.)
build_llama() {
  rm -rf /tmp/llama.cpp && tar xJf .device/llama.cpp.tar.xz -C /tmp
  (cd /tmp/llama.cpp && cmake -B build -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
     -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
     -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_TYPE=Release \
     > "$out/llamacpp-cmake.log" 2>&1 \
   && cmake --build build -j"$threads" --target llama-bench > "$out/llamacpp-build.log" 2>&1)
  lap "llama-bench build rc=$?"
}
[ -z "$lb" ] && [ -f .device/llama.cpp.tar.xz ] && { build_llama & }
# shellcheck disable=SC2086
[ -n "${MIXES:-}" ] || [ -f "$model" ] || .device/bin/synth $synth_args --threads "$threads" --out "$model" > "$out/synth.log" 2>&1
lap "synth done ($model)"
wait
# KVARIANTS: environment settings the kernel benches run under, one run each per KROUNDS round
# (default one plain run; a variant may set LAGOON_BENCH_THREADS or LAGOON_BENCH_MIB); KFILTER:
# their criterion filter (default: the stream read, the one-token GEMV with all threads and the
# grouped prefill); KTIME: seconds of measurement per bench (2).
# PAIRS=N: first the expert GEMV of KINDS against a streaming read taken beside it, N rounds
# (the kernels bench's LAGOON_BENCH_PAIRS; this host's read drifts ±20% within a call, so a
# fraction is only meaningful against a read taken next to it).
if [ -x .device/bin/kernels-bench ] && [ -n "${PAIRS:-}" ]; then
  LAGOON_BENCH_PAIRS=$PAIRS LAGOON_BENCH_KINDS=${KINDS:-} LAGOON_BENCH_THREADS=$threads \
    .device/bin/kernels-bench --bench '^nomatch$' 2>&1 | grep "^pairs" | tee -a "$out/kernels.log"
  lap "paired GEMV"
fi
if [ -x .device/bin/kernels-bench ]; then
  for kround in $(seq "${KROUNDS:-1}"); do
    for kv in ${KVARIANTS:-PLAIN=1}; do
      echo "== kernels $kv (round $kround)"
      env LAGOON_BENCH_KINDS=${KINDS:-} LAGOON_BENCH_THREADS=$threads ${kv//,/ } .device/bin/kernels-bench --bench \
        --warm-up-time 1 --measurement-time "${KTIME:-2}" \
        "${KFILTER:-^(stream_read_[0-9]+t|expert_gemv_1tok_avx512vnni_[0-9]+t|prefill_experts)}" 2>&1 \
        | grep -E "^(stream|expert|prefill|x8_)|thrpt" | tee -a "$out/kernels.log"
    done
  done
  lap "kernels bench"
fi
lb=$(find /tmp/llama.cpp/build -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)
# Both engines on one file, alternating, ROUNDS times.
compare() {
for round in $(seq "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-PLAIN=1}; do
    echo "== $v"
    # shellcheck disable=SC2086
    env ${v//,/ } .device/bin/bench --model "$model" ${BENCH_ARGS:--p 512 -n 128 -r 3} --threads "$threads" \
      > "$out/bench.log" 2>&1
    cat "$out/bench.log" >> "$out/bench-all.log"
    # The result rows, and with --profile the node table's largest lines.
    grep -E "^\| node|time per" -A"${PLINES:-14}" "$out/bench.log" | cut -c1-140
    grep -E "^\||floor" "$out/bench.log" | grep -E "floor|t/s|pp|tg" | tail -3
  done
  lap "lagoon round $round"
  if [ -n "$lb" ]; then
    "$lb" -m "$model" -t "$threads" -p 512 -n 128 -r 3 2>&1 | grep -E "^\|" | tail -3
    lap "llama.cpp round $round"
  fi
done
}
if [ -z "${MIXES:-}" ]; then
  compare
else
  for mix in $MIXES; do
    model=/dev/shm/mix-$mix.gguf
    .device/bin/synth --preset "${PRESET:-xs.2}" --layers "${LAYERS:-8}" --types "$mix" --no-sync \
      --threads "$threads" --out "$model" > "$out/synth-$mix.log" 2>&1 || { echo "== $mix: synth failed"; tail -3 "$out/synth-$mix.log"; continue; }
    echo "=== mix $mix ($(du -h "$model" | cut -f1))"
    compare
    rm -f "$model"
  done
fi
