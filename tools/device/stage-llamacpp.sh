#!/usr/bin/env bash
# Stages llama.cpp's source (the tree vendored in the llama-cpp-python 0.3.36 sdist, llama.cpp
# commit 0c1e570, the version every llama.cpp figure in BENCHMARKS.md uses) into
# .device/llama.cpp.tar.xz, trimmed to what a CPU-only x86 llama-bench build needs and
# compressed (~3 MB; the device call carries at most 64 MiB with the working tree), so that
# one device call can build it on the GPU machine's host, which cannot download anything.
# Nothing of it is committed: .device/ is git-ignored. Run here, from the repository root:
#   tools/device/stage-llamacpp.sh [PATH/TO/llama_cpp_python-0.3.36.tar.gz]
# (without an argument the sdist is downloaded with pip into /tmp).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
sdist=${1:-}
if [ -z "$sdist" ]; then
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
    llama-cpp-python==0.3.36 -d /tmp/llamacpp-sdist
  sdist=/tmp/llamacpp-sdist/llama_cpp_python-0.3.36.tar.gz
fi
tmp=$(mktemp -d)
tar xzf "$sdist" -C "$tmp"
src="$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp"
dst=.device/llama.cpp
rm -rf "$dst" && mkdir -p "$dst"
for p in CMakeLists.txt cmake common include src vendor ggml/CMakeLists.txt ggml/cmake ggml/include \
         ggml/src/CMakeLists.txt ggml/src/ggml-cpu tools/CMakeLists.txt tools/llama-bench; do
  mkdir -p "$dst/$(dirname "$p")"
  cp -r "$src/$p" "$dst/$p"
done
# Top-level sources of ggml/src (ggml.c, ggml-backend, gguf, ...), without the other backends.
find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$dst/ggml/src/" \;
# The tools list, cut to llama-bench (the other tools' sources are not staged).
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' \
  > "$dst/tools/CMakeLists.txt"
# Other architectures' CPU code.
rm -rf "$dst"/ggml/src/ggml-cpu/arch/{arm,loongarch,powerpc,riscv,s390,wasm} \
  "$dst"/ggml/src/ggml-cpu/{spacemit,kleidiai}
rm -rf "$tmp"
tar cJf .device/llama.cpp.tar.xz -C .device llama.cpp
rm -rf "$dst"
du -sh .device/llama.cpp.tar.xz
