#!/usr/bin/env python3
# peers_table.py: docs/peers.md's grid table from a grid run with the peers' policies.
#
#   bytescale simulate --grid --seeds 8 --policy balance,elastic,megatron-hcp,wlb,flexsp \
#       --out /tmp/grid-peers8 --no-plot
#   scripts/peers_table.py /tmp/grid-peers8/paper-grid.csv
#
# A cell's seeds are the consecutive steps of one run (wlb's delayed documents go into its next step,
# the last step flushes), so a run's throughput is tokens_mean / step_s_mean: the same total tokens
# over the same number of steps for every policy. tokens_per_s_mean, the mean of the steps' own
# tokens/s, is what a single step suggests; it is printed in parentheses for wlb only, the one policy
# whose steps differ (a step without its outliers looks faster than a run). "best" is the faster run of
# bytescale's balance and elastic; best / peer > 1 means bytescale is faster, bold where the peer wins.
# The cells where a peer wins go to stderr.
import collections
import csv
import math
import sys

if len(sys.argv) != 2:
    sys.exit("usage: peers_table.py GRID.csv")
rows = list(csv.DictReader(open(sys.argv[1])))
cells = collections.OrderedDict()
for r in rows:
    cells.setdefault(r[next(iter(r))], {})[r["policy"]] = r


def run(r):  # total tokens / total time over the run
    return float(r["tokens_mean"]) / float(r["step_s_mean"])


peers = ["megatron-hcp", "wlb", "flexsp"]
logs = {p: [] for p in peers}
logs["wlb-step"] = []
wins = {p: [] for p in peers}
print("| cell | best (run tok/s) | best / megatron-hcp | best / wlb (per-step mean) | best / flexsp |")
print("|---|---|---|---|---|")
for cell, pol in cells.items():
    b = max(("balance", "elastic"), key=lambda p: run(pol[p]))
    best = run(pol[b])
    bstep = max(float(pol[p]["tokens_per_s_mean"]) for p in ("balance", "elastic"))
    out = []
    for p in peers:
        x = best / run(pol[p])
        logs[p].append(math.log(x))
        if x < 1:
            wins[p].append(f"{cell} {x:.2f}")
        s = f"**{x:.2f}**" if x < 1 else f"{x:.2f}"
        if p == "wlb":
            y = bstep / float(pol[p]["tokens_per_s_mean"])
            logs["wlb-step"].append(math.log(y))
            s += f" ({y:.2f})"
        out.append(s)
    print(f"| {cell} | {b} {best:.3g} | " + " | ".join(out) + " |")
g = {p: math.exp(sum(v) / len(v)) for p, v in logs.items()}
print(f"| geometric mean | | {g['megatron-hcp']:.2f} | {g['wlb']:.2f} ({g['wlb-step']:.2f}) | {g['flexsp']:.2f} |")
for p in peers:
    print(f"{p} faster in {len(wins[p])} cells: {', '.join(wins[p])}", file=sys.stderr)
