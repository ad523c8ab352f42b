#!/usr/bin/env python3
"""The instruction mix of a kernel's tensor-core mainloops, from the dumps that
`SASS_OUT=DIR cuda/dev/sass.sh KERNEL...` writes: `cuda/dev/sass-loops.py DIR/KERNEL.sass...`.

A mainloop is a run of the dump whose HMMA (mma.sync) or HGMMA (wgmma) instructions lie
less than `--gap` instructions apart (default 400: a kernel with two mainloops, such as a
format decoded by dtype in gemm_rf.cu's rf_loop, shows two). For each run: instructions from
its first tensor instruction to its last, per tensor instruction, the reconvergence points
(BSSY: a branch ptxas could not turn into predication), and the most frequent opcodes.

How session 35 found the CT4 prefill decode's branch per block: 2,934 instructions per 512
HMMAs and 32 more BSSY than Q4_K's kernel (BENCHMARKS.md, "Session 35 on the H200").
Standard library only.
"""
import argparse
import re
from collections import Counter

OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
TENSOR = {"HMMA", "HGMMA", "IMMA"}


def opcodes(path):
    ops = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                m = OPCODE.match(line)
                ops.append(m.group(1) if m else "?")
    return ops


def runs(ops, gap):
    idx = [i for i, o in enumerate(ops) if o in TENSOR]
    out = []
    for i in idx:
        if out and i - out[-1][-1] <= gap:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--gap", type=int, default=400)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for path in args.dumps:
        ops = opcodes(path)
        loops = runs(ops, args.gap)
        print(f"{path}: {len(ops)} instructions, {len(loops)} mainloop(s)")
        for lo, hi in ((r[0], r[-1]) for r in loops):
            c = Counter(ops[lo : hi + 1])
            n = sum(c[t] for t in TENSOR)
            span = hi - lo + 1
            mix = " ".join(f"{k} {v}" for k, v in c.most_common(args.top))
            print(f"  [{lo}, {hi}]: {span} instructions, {n} tensor, {span / n:.2f} per tensor "
                  f"instruction, BSSY {c['BSSY']}; {mix}")


if __name__ == "__main__":
    main()
