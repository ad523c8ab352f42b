#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from the timeline probe (cuda/src/trace.rs).

    trace-summary.py TRACE [STEPS]

TRACE is the file LAGOON_CUDA_TRACE named (with TRACE.names beside it). Each launch's first
block recorded when it triggered and when its pdl_wait started and ended. A launch is
`ready` when its wait ended (or, without a wait, when it started); the time from one launch's
ready to the next one's is that launch's share of the critical path (the next launch waits
for it to finish). The step length is found as the period of the launches' grid shapes; the
last STEPS steps (default 16) are summarised: per kernel name (the host's launches with the
same grid and block), launches per step, µs each and per step on the critical path (median
over the steps), and how long its first block waited in pdl_wait; then one layer's launches
in order (the most common layer shape), each with its median share of the critical path.
"""
import collections
import statistics
import sys


def main():
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    recs = []
    with open(path) as f:
        for line in f:
            g, t, k, gx, gy, b = map(int, line.split())
            recs.append((g, t, k, (gx, gy, b)))
    names = collections.defaultdict(set)
    try:
        with open(path + ".names") as f:
            for line in f:
                n, gx, gy, b = line.split()
                names[(int(gx), int(gy), int(b))].add(n)
    except OSError:
        pass
    # Launches: a grid id's records in time order, a new launch whenever a kind repeats (the
    # id may be reused by a later replay).
    by_gid = collections.defaultdict(list)
    for g, t, k, sig in recs:
        by_gid[g].append((t, k, sig))
    launches = []
    for g, rs in by_gid.items():
        rs.sort()
        cur = {}
        for t, k, sig in rs:
            if k in cur:
                launches.append(cur)
                cur = {}
            cur[k] = t
            cur["sig"] = sig
        if cur:
            launches.append(cur)
    for l in launches:
        l["start"] = min(v for k, v in l.items() if isinstance(k, int))
        l["ready"] = l.get(2, l["start"])
    launches.sort(key=lambda l: l["start"])
    sigs = [l["sig"] for l in launches]
    n = len(sigs)
    # The last launches may not repeat (a run that ends on other work, such as the bench's
    # closing launches after its timed steps): drop them, 50 at a time, until a period shows.
    # A step holds the lm_head, the widest grid (without that condition a run of layers
    # repeats too).
    widest = max(sigs, key=lambda g: g[0] * g[1])
    period = None
    for trim in range(0, n // 2, 50):
        m = n - trim
        for p in range(20, m // 3):
            if widest in sigs[m - p : m] and all(
                sigs[m - 1 - i] == sigs[m - 1 - i - p] for i in range(2 * p)
            ):
                period = p
                break
        if period is not None:
            break
    if period is None:
        sys.exit(f"no repeating step found in {n} launches")
    if trim:
        print(f"(the last {trim} launches do not repeat: left out)")
        launches, sigs, n = launches[:m], sigs[:m], m
    steps = min(steps, n // period - 1)
    first = n - steps * period
    print(f"{n} launches traced; a step is {period} launches; the last {steps} steps:")
    totals = []
    per = collections.defaultdict(list)  # name -> per-step (count, span µs, wait µs)
    for s in range(steps):
        a = first + s * period
        b = a + period
        if b >= n:
            break
        totals.append((launches[b]["ready"] - launches[a]["ready"]) / 1e3)
        acc = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for i in range(a, b):
            l = launches[i]
            nm = "|".join(sorted(names.get(l["sig"], {"?"}))) + " %dx%dx%d" % l["sig"]
            e = acc[nm]
            e[0] += 1
            e[1] += (launches[i + 1]["ready"] - l["ready"]) / 1e3
            if 1 in l and 2 in l:
                e[2] += (l[2] - l[1]) / 1e3
        for nm, e in acc.items():
            per[nm].append(e)
    step = statistics.median(totals)
    print(f"step: median {step:.1f} µs ({1e6 / step:.1f} t/s), min {min(totals):.1f}, max {max(totals):.1f}")
    rows = []
    for nm, es in per.items():
        cnt = es[0][0]
        span = statistics.median(e[1] for e in es)
        wait = statistics.median(e[2] for e in es)
        rows.append((span, nm, cnt, wait))
    rows.sort(reverse=True)
    print("| kernel (grid x, y, block) | per step | µs each | µs / step | share | first block's wait, µs / step |")
    print("|---|---:|---:|---:|---:|---:|")
    for span, nm, cnt, wait in rows:
        print(f"| {nm} | {cnt} | {span / cnt:.2f} | {span:.1f} | {100 * span / step:.1f}% | {wait:.1f} |")
    layer_view(launches, names, first, period, steps)


def layer_view(launches, names, first, period, steps):
    """The launches of one layer in order, median span per position over the layers of the
    most common shape (a layer starts at the launch before its Q/K/V product: the norm, or at
    the product itself when the norm is folded into it)."""
    def nm(l):
        return "|".join(sorted(names.get(l["sig"], {"?"})))
    rows = collections.defaultdict(list)
    for s in range(steps):
        a = first + s * period
        seq = launches[a:a + period + 1]
        # (Under NORM_EPI the attention norm rides in the down kernel before a W4A16 layer's
        # products, `mv_rinv`: the layer then starts at the products.)
        starts = [i - 1 if "norm" in nm(seq[i - 1]) else i for i in range(1, len(seq) - 1)
                  if "mv" in nm(seq[i]) and 2000 <= seq[i]["sig"][0] < 25000
                  and ("norm" in nm(seq[i - 1]) or "mv_rinv" in nm(seq[i]))]
        for j in range(len(starts) - 1):
            lay = seq[starts[j]:starts[j + 1] + 1]
            key = tuple(l["sig"] for l in lay[:-1])
            rows[key].append([(lay[i + 1]["ready"] - lay[i]["ready"]) / 1e3 for i in range(len(lay) - 1)])
    if not rows:
        return
    key, spans = max(rows.items(), key=lambda kv: len(kv[1]))
    print(f"\none layer, in launch order (the most common shape: {len(spans)} layers over the steps):")
    print("| # | launch (grid x, y, block) | µs on the critical path (median) |")
    print("|---:|---|---:|")
    tot = 0.0
    for i, sig in enumerate(key):
        m = statistics.median(sp[i] for sp in spans)
        tot += m
        n = "|".join(sorted(names.get(sig, {"?"})))
        print(f"| {i + 1} | {n} {sig[0]}x{sig[1]}x{sig[2]} | {m:.2f} |")
    print(f"| | layer | {tot:.1f} |")


if __name__ == "__main__":
    main()
