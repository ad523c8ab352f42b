#!/usr/bin/env bash
# Registers and spills of every kernel as ptxas reports them for sm_90, without a GPU (the
# nvrtc venv that .ci/run makes): `cuda/dev/ptxas-regs.sh [kernel-name regex]`.
set -eu
v=~/.cache/lagoon/nvrtc-venv
cu13=$($v/bin/python -c 'import nvidia,os;print(os.path.join(nvidia.__path__[0],"cu13"))')
export LAGOON_CUDA_INCLUDE=$cu13/include LD_LIBRARY_PATH=$cu13/lib LAGOON_PTXAS=$cu13/bin/ptxas LAGOON_PTXAS_VERBOSE=1
cargo test -q -p lagoon-cuda --test nvrtc_compile every_kernel -- --nocapture 2>/dev/null \
  | grep -E "Compiling entry|registers|spill" | sed 's/ptxas info *: //' \
  | awk '/Compiling/{name=$4} /Used/{print name, $0} /spill/ && !/0 bytes spill stores, 0 bytes spill loads/{print name, "SPILL", $0}' \
  | grep -E "${1:-.}" || true
