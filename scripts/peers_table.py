#!/usr/bin/env python3
# peers_table.py: docs/peers.md's grid table from a grid run with the peers' policies.
#
#   bytescale simulate --grid --seeds 50 --policy balance,elastic,megatron-hcp,wlb,flexsp \
#       --out /tmp/grid-peers --no-plot
#   scripts/peers_table.py /tmp/grid-peers/paper-grid.csv
#
# or the grid in parts run side by side (--cells K/N), their CSVs given together:
#
#   scripts/peers_table.py /tmp/grid-peers-1/paper-grid.csv /tmp/grid-peers-2/paper-grid.csv
#
# A cell's seeds are the consecutive steps of one run (wlb's delayed documents go into its next step,
# the last step flushes), so a run's throughput is tokens_mean / step_s_mean: the same total tokens
# over the same number of steps for every policy. tokens_per_s_mean, the mean of the steps' own
# tokens/s, is what a single step suggests; it is printed in parentheses for wlb only, the one policy
# whose steps differ (a step without its outliers looks faster than a run). "best" is the faster run of
# bytescale's balance and elastic; best / peer > 1 means bytescale is faster, bold where the peer wins.
# The peers are every other policy of the CSV but static and naive (so blocks and blocks-all appear
# when the grid ran them). The last column is the largest share of a run's simulated time that its
# first and its flushing step take, over the cell's policies (the CSV's first_flush_share; absent in
# CSVs older than that column): below 5% the run is its steady state. The cells where a peer wins and
# each policy's largest share go to stderr.
#
# CSVs of runs of different lengths may be given together (e.g. a long run of the fast policies and a
# shorter one with flexsp, whose GLPK time dominates the grid): every ratio compares a peer with
# bytescale's best of the longest run that has both, so each ratio is over the same documents; the
# steps of each peer's runs go to stderr.
import collections
import csv
import math
import re
import sys

OWN = ("static", "naive", "naive-nooff", "naive-eq3min", "balance", "elastic")
MODELS = ("7b", "13b", "30b", "70b", "8x7b", "8x22b")  # the grid's order, for CSVs of its parts
SIZE = {"k": 1 << 10, "m": 1 << 20}

if len(sys.argv) < 2:
    sys.exit("usage: peers_table.py GRID.csv [MORE.csv ...]")
cells = collections.OrderedDict()  # scenario -> {seeds: {policy: row}}
policies = []
for path in sys.argv[1:]:
    for r in csv.DictReader(open(path)):
        cells.setdefault(r["scenario"], {}).setdefault(int(r.get("seeds") or 0), {})[r["policy"]] = r
        if r["policy"] not in policies:
            policies.append(r["policy"])


def grid_key(item):  # "7b-1024-byted-256k": model, dataset, context; other names keep their order
    m = re.fullmatch(r"(.+)-(\d+)-(\w+)-(\d+)([km])", item[1][0])
    if not m or m.group(1) not in MODELS:
        return (len(MODELS), item[0], "", 0)
    return (MODELS.index(m.group(1)), 0, m.group(3), int(m.group(4)) * SIZE[m.group(5)])


cells = [c for _, c in sorted(enumerate(cells.items()), key=grid_key)]
peers = [p for p in policies if p not in OWN]


def run(r):  # total tokens / total time over the run
    return float(r["tokens_mean"]) / float(r["step_s_mean"])


def share(r):
    x = r.get("first_flush_share", "")
    return float(x) if x not in ("", None) else float("nan")


logs = {p: [] for p in peers}
logs["wlb-step"] = []
wins = {p: [] for p in peers}
most = {p: (0.0, "") for p in policies}
head = [f"best / {p} (per-step mean)" if p == "wlb" else f"best / {p}" for p in peers]
print("| cell | best (run tok/s) | " + " | ".join(head) + " | first+flush (max) |")
print("|---|---|" + "---|" * len(peers) + "---|")
steps = {p: set() for p in peers}


def best_of(pol):  # bytescale's faster run and its name, its per-step mean
    b = max(("balance", "elastic"), key=lambda p: run(pol[p]) if p in pol else 0)
    return b, run(pol[b]), max(float(pol[p]["tokens_per_s_mean"]) for p in ("balance", "elastic") if p in pol)


for cell, runs in cells:
    longest = max(runs)
    out = []
    for p in peers:
        have = [n for n in runs if p in runs[n] and ("balance" in runs[n] or "elastic" in runs[n])]
        if not have:
            out.append("-")
            continue
        steps[p].add(max(have))
        pol = runs[max(have)]
        _, best, bstep = best_of(pol)
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
    rows = [(p, r) for n in runs for p, r in runs[n].items()]
    for p, r in rows:
        if share(r) > most[p][0]:
            most[p] = (share(r), cell)
    top = max((share(r) for _, r in rows), default=float("nan"))
    b, best, _ = best_of(runs[longest])
    print(f"| {cell} | {b} {best:.3g} | " + " | ".join(out) + (f" | {100 * top:.1f}% |" if top == top else " | - |"))
g = {p: math.exp(sum(v) / len(v)) if v else float("nan") for p, v in logs.items()}
geo = [f"{g[p]:.2f} ({g['wlb-step']:.2f})" if p == "wlb" else f"{g[p]:.2f}" for p in peers]
print("| geometric mean | | " + " | ".join(geo) + " | |")
for p in peers:
    print(f"{p}: runs of {', '.join(str(n) for n in sorted(steps[p]))} steps", file=sys.stderr)
for p in peers:
    print(f"{p} faster in {len(wins[p])} cells: {', '.join(wins[p])}", file=sys.stderr)
for p in policies:
    if most[p][1]:
        print(f"{p}: first+flush share at most {100 * most[p][0]:.1f}% ({most[p][1]})", file=sys.stderr)
