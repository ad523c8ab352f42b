# Sourced by the device scripts (decode-profile.sh, define-sweep.sh): the synth checkpoint
# they bench, named and made in /dev/shm. `shm_model TYPES PRESET LOG` sets $model to
# /dev/shm/PRESET-TYPES (a directory for the compressed-tensors mixes int4-g32 and int8, a
# .gguf file otherwise), or to $MODEL when that is set, and makes it with .device/bin/synth
# (output in LOG) when it is not there. Room for it: one full-size S 2.1 checkpoint at a
# time fits /dev/shm, so before making one there the names these scripts give are removed
# (nothing else).
shm_model() {
  local types=$1 preset=$2 log=$3
  case "$types" in
    int4-g32 | int8) model=${MODEL:-/dev/shm/$preset-$types} ;;
    *) model=${MODEL:-/dev/shm/$preset-$types.gguf} ;;
  esac
  [ -e "$model" ] && return 0
  case "$model" in
    /dev/shm/*) rm -rf /dev/shm/*.gguf /dev/shm/*-int4-g32 /dev/shm/*-int8 /dev/shm/w ;;
  esac
  .device/bin/synth --preset "$preset" --types "$types" --threads 16 --out "$model" > "$log" 2>&1
}
