#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from the timeline probe (cuda/src/trace.rs).

    trace-summary.py TRACE [STEPS]

TRACE is the file LAGOON_CUDA_TRACE named (with TRACE.names beside it). Each launch's first
block recorded when it triggered and when its pdl_wait started and ended. A launch is
`ready` when its wait ended (or, without a wait, when it started); the time from one launch's
ready to the next one's is that launch's share of the critical path (the next launch waits
for it to finish). The step length is found as the period of the launches' grid shapes; the
last STEPS steps (default 16) are summarised: per kernel, launches per step, µs each and per
step on the critical path (median over the steps), and how long its first block waited in
pdl_wait; then one layer's launches in order (the most common layer shape), each with its
median share of the critical path. A launch is named by the host launch at its place in the
step (TRACE.names lists the host's launches in order, the captured step among them), so
kernels of one grid shape (the expert down and the O projection, 768 blocks) are told apart;
when no window of the host's order matches the traced step, by the kernels launched with its
grid (joined by |), as before.
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
    host = []  # the host's launches in launch order: (name, sig)
    try:
        with open(path + ".names") as f:
            for line in f:
                n, gx, gy, b = line.split()
                sig = (int(gx), int(gy), int(b))
                names[sig].add(n)
                host.append((n, sig))
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
    if name_by_order(launches, host, first, period):
        print("(each launch named by its place in the host's launch order)")
    else:
        print("(launches named by grid shape: kernels of one shape share a name)")
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
            nm = launch_name(l, names) + " %dx%dx%d" % l["sig"]
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


def name_by_order(launches, host, first, period):
    """Names each traced launch of the steps from `first` on (`l["name"]`) by the host launch
    at the same place in a step: the host noted a step's launches in order when it captured
    the step's graph, so a window of `period` host launches whose grids match the traced
    step's, at some rotation, says which kernel each launch is even where several kernels
    share a grid shape. False (nothing named) when no window matches."""
    sigs = [l["sig"] for l in launches]
    hs = [h[1] for h in host]
    if len(sigs) < first + 2 * period:
        return False
    for r in range(period):
        want = sigs[first + r:first + r + period]
        for j in range(len(hs) - period, -1, -1):
            if hs[j:j + period] == want:
                for i in range(first, len(launches)):
                    launches[i]["name"] = host[j + (i - first - r) % period][0]
                return True
    return False


def launch_name(l, names):
    """The launch's kernel (name_by_order), else every kernel launched with its grid."""
    return l.get("name") or "|".join(sorted(names.get(l["sig"], {"?"})))


def layer_view(launches, names, first, period, steps):
    """The launches of one layer in order, median span per position over the layers of the
    most common shape (a layer starts at the launch before its Q/K/V product: the norm, or at
    the product itself when the norm is folded into it)."""
    def nm(l):
        return launch_name(l, names)
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
            key = tuple((nm(l), l["sig"]) for l in lay[:-1])
            rows[key].append([(lay[i + 1]["ready"] - lay[i]["ready"]) / 1e3 for i in range(len(lay) - 1)])
    if not rows:
        return
    key, spans = max(rows.items(), key=lambda kv: len(kv[1]))
    print(f"\none layer, in launch order (the most common shape: {len(spans)} layers over the steps):")
    print("| # | launch (grid x, y, block) | µs on the critical path (median) |")
    print("|---:|---|---:|")
    tot = 0.0
    for i, (n, sig) in enumerate(key):
        m = statistics.median(sp[i] for sp in spans)
        tot += m
        print(f"| {i + 1} | {n} {sig[0]}x{sig[1]}x{sig[2]} | {m:.2f} |")
    print(f"| | layer | {tot:.1f} |")


if __name__ == "__main__":
    main()
