#!/usr/bin/env python3
"""Where one decode step's kernel time goes, from the ncu CSV that cuda/dev/decode-profile.sh
writes (`ncu --metrics gpu__time_duration.sum --csv --page raw`, every kernel of a short
`bench -n N` decode run): `cuda/dev/ncu-summary.py ncu-decode.csv [--step K]`.

Steps are split at the embedding kernels (`embed_*`, one per step); by default the last step
is summarised (the run's earlier ones include the floor probe and the first token). Prints a
markdown table per kernel name: launches, µs per launch, total µs and share of the step,
registers per thread and waves per SM where the CSV has them. Standard library only.
"""
import csv
import sys
from collections import OrderedDict


def rows(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    reader = csv.reader(lines[start:])
    header = next(reader)
    col = {name: i for i, name in enumerate(header)}
    units = None
    for r in reader:
        if len(r) != len(header):
            continue
        if r[col["ID"]] == "":  # ncu's units row
            units = r
            continue
        yield col, units, r


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    step_arg = int(args[args.index("--step") + 1]) if "--step" in args else -1
    launches = list(rows(args[0]))
    if not launches:
        sys.exit("no kernel rows in " + args[0])
    col, units, _ = launches[0]
    tcol = col["gpu__time_duration.sum"]
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}
    unit = (units[tcol] if units else "ns") or "ns"
    to_us = scale.get(unit, 1e-3)
    steps, cur = [], None
    for c, _, r in launches:
        name = r[c["Kernel Name"]]
        if name.startswith("embed_"):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(r)
    if not steps:
        sys.exit("no embed_* kernel: cannot find the steps")
    step = steps[step_arg]
    agg = OrderedDict()
    for r in step:
        name = r[col["Kernel Name"]]
        t = float(r[tcol].replace(",", "")) * to_us
        regs = r[col["launch__registers_per_thread"]] if "launch__registers_per_thread" in col else ""
        waves = r[col["launch__waves_per_multiprocessor"]] if "launch__waves_per_multiprocessor" in col else ""
        a = agg.setdefault(name, [0, 0.0, regs, []])
        a[0] += 1
        a[1] += t
        if waves:
            a[3].append(float(waves.replace(",", "")))
    total = sum(a[1] for a in agg.values())
    print(f"step {step_arg if step_arg >= 0 else len(steps) + step_arg} of {len(steps)}: "
          f"{len(step)} kernels, {total:.1f} µs of kernel time")
    print("| kernel | launches | µs each | total µs | share | registers | waves/SM |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (n, t, regs, waves) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        w = f"{sum(waves) / len(waves):.2f}" if waves else ""
        print(f"| {name} | {n} | {t / n:.1f} | {t:.1f} | {100 * t / total:.1f}% | {regs} | {w} |")


if __name__ == "__main__":
    main()
