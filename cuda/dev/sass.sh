#!/usr/bin/env bash
# The SASS (sm_90 machine code) of kernels, without a GPU: `cuda/dev/sass.sh KERNEL...`.
# Compiles every kernel source once through the NVRTC test with LAGOON_PTXAS_KEEP (the nvrtc
# venv that .ci/run makes), fetches cuobjdump and nvdisasm from NVIDIA's PyPI wheels once into
# ~/.cache/lagoon/cuobjdump, and prints each kernel's SASS: to count a loop's instructions or
# check that a refactor left the machine code unchanged. With SASS_OUT=DIR each kernel's
# instructions go to DIR/KERNEL.sass instead, addresses and encodings stripped, so two trees'
# dumps compare with `diff -r` (how session 10 checked the merge.cuh and rf_formats.cuh
# refactors), and `cuda/dev/sass-loops.py DIR/*.sass` prints each tensor-core mainloop's
# instruction mix.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 KERNEL..." >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cache=~/.cache/lagoon/cuobjdump
v=~/.cache/lagoon/nvrtc-venv
if [ ! -x "$cache/nvidia/cu13/bin/cuobjdump" ]; then
  mkdir -p "$cache/whl"
  "$v/bin/pip" download -q --no-deps -d "$cache/whl" nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
  (cd "$cache" && for w in whl/*.whl; do python3 -m zipfile -e "$w" .; done && chmod +x nvidia/cu13/bin/*)
fi
cu13=$(cd / && "$v/bin/python" -c 'import nvidia,os;print(os.path.join(nvidia.__path__[0],"cu13"))')
keep=$(mktemp -d)
(cd "$root" && LAGOON_CUDA_INCLUDE=$cu13/include LD_LIBRARY_PATH=$cu13/lib LAGOON_PTXAS=$cu13/bin/ptxas \
  LAGOON_PTXAS_KEEP=$keep cargo test -q -p lagoon-cuda --test nvrtc_compile every_kernel > /dev/null 2>&1)
[ -n "${SASS_OUT:-}" ] && mkdir -p "$SASS_OUT"
missing=0
for name in "$@"; do
  found=0
  for c in "$keep"/*.cubin; do
    if PATH=$cache/nvidia/cu13/bin:$PATH cuobjdump -sass -fun "$name" "$c" > "$keep/out" 2> /dev/null \
       && grep -q "Function : $name\$" "$keep/out"; then
      if [ -n "${SASS_OUT:-}" ]; then
        grep -E '^\s+/\*[0-9a-f]{4,}\*/' "$keep/out" | sed 's#/\*[0-9a-f]*\*/##; s#;.*##' > "$SASS_OUT/$name.sass"
      else
        echo "// $(basename "$c" .cubin)"; cat "$keep/out"
      fi
      found=1
    fi
  done
  [ "$found" = 1 ] || { echo "no kernel named $name" >&2; missing=1; }
done
rm -rf "$keep"
exit $missing
