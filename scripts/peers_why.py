#!/usr/bin/env python3
# peers_why.py: why one policy beats another in a cell of a grid run, from the simulator's per-rank
# breakdown (the CSV columns of `bytescale simulate --grid`; docs/simulator.md, "Runs").
#
#   scripts/peers_why.py /tmp/grid-peers/paper-grid.csv 70b-8192-byted-256k [MORE.csv ...]
#
# One row per policy, each the mean over the run's steps: run tokens/s (total tokens over total
# time), step time, compute imbalance (the busiest (rank, stage)'s busy time over the mean: balance),
# exposed communication and waiting per (rank, stage) (traffic), the longest item's estimated time
# (the longest sequence's spread: no step is shorter), ring traffic, and the first and flushing steps'
# share of the run. `bytescale simulate --scenario CELL --seeds N --policy ...` prints the same
# breakdown for one cell under its table.
import csv
import sys

if len(sys.argv) < 3:
    sys.exit("usage: peers_why.py GRID.csv CELL [MORE.csv ...]")
cell = sys.argv[2]
rows = [r for path in [sys.argv[1]] + sys.argv[3:] for r in csv.DictReader(open(path)) if r["scenario"] == cell]
if not rows:
    sys.exit(f"peers_why.py: no cell '{cell}' in the CSV")
need = ("busy_max_over_mean_mean", "comm_mean_s_mean", "wait_mean_s_mean", "longest_item_s_mean")
if any(c not in rows[0] for c in need):
    sys.exit("peers_why.py: the CSV has no per-rank breakdown columns (made before they were added); run the grid again")
print(f"{cell}: means over the run's steps")
print(f"| policy | run tok/s | step s | busy max / mean | comm mean s | wait mean s | longest item s | ring TB | "
      f"first+flush |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    run = float(r["tokens_mean"]) / float(r["step_s_mean"])
    ff = r.get("first_flush_share", "")
    ff = f"{100 * float(ff):.1f}%" if ff else "-"
    print(f"| {r['policy']} | {run:.3g} | {float(r['step_s_mean']):.3f} | {float(r['busy_max_over_mean_mean']):.3f} | "
          f"{float(r['comm_mean_s_mean']):.3f} | {float(r['wait_mean_s_mean']):.3f} | "
          f"{float(r['longest_item_s_mean']):.3f} | {float(r['ring_tb_mean']):.1f} | {ff} |")
