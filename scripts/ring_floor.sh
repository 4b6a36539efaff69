#!/usr/bin/env bash
# ring_floor.sh: how the ring-step floor (attn_step, docs/cost-model.md section 4) moves the simulated
# results. Runs the paper grid and the case study on h100-measured twice, with its fitted floor and
# with the floor set to 0, every policy of the comparison on the same batches (8 seeds), and prints
# the tokens/s and speedups over static side by side (markdown).
#
#   scripts/ring_floor.sh [OUT]          (default OUT=ring-floor-out; BS=path to the bytescale binary)
#
# The two profiles are written as files: h100-measured's numbers, attn_step 2.48e-4 or 0. The first is
# checked against the built-in h100-measured (the same case-study JSON), so this file cannot drift
# from src/core/hw.c unnoticed.
set -euo pipefail

OUT=${1:-ring-floor-out}
BS=${BS:-./build/bytescale}
POLICIES=${POLICIES:-static,naive,balance,elastic,megatron-hcp,wlb,flexsp}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3  # only the standard library is needed; either works

if [ ! -x "$BS" ]; then
    echo "ring_floor.sh: $BS is not built (run make, or set BS=path/to/bytescale)" >&2
    exit 2
fi
mkdir -p "$OUT"

profile() {  # $1 name, $2 attn_step: h100-measured as a file (docs/hardware.md has every number's source)
    cat > "$OUT/$1.json" <<EOF
{"name": "$1", "gpus_per_node": 8, "peak_flops": 989e12, "efficiency": 0.535, "attn_efficiency": 0.479,
 "mem_bytes": 80e9, "mem_bw": 3.35e12, "intra_bw": 450e9, "inter_bw": 50e9, "intra_lat": 5e-6,
 "inter_lat": 10e-6, "host_bw": 54.7e9, "elem_bytes": 2, "attn_step": $2}
EOF
}
profile floor 2.48e-4
profile nofloor 0

# the file with the floor must be the built-in profile, number for number: same results
echo "checking $OUT/floor.json against the built-in h100-measured ..." >&2
"$BS" simulate --scenario case-study --seeds 2 --policy static,balance --hardware h100-measured --json > "$OUT/check-builtin.json"
"$BS" simulate --scenario case-study --seeds 2 --policy static,balance --hardware "$OUT/floor.json" --json > "$OUT/check-file.json"
"$PY" - "$OUT/check-builtin.json" "$OUT/check-file.json" <<'EOF'
import json, sys
def simulated(x):  # everything but the wall times of planning and simulating
    if isinstance(x, dict):
        return {k: simulated(v) for k, v in x.items() if not k.endswith("_seconds")}
    return [simulated(v) for v in x] if isinstance(x, list) else x
a, b = (simulated(json.load(open(p))["results"]) for p in sys.argv[1:3])
if a != b:
    sys.exit("ring_floor.sh: floor.json does not reproduce h100-measured: update the numbers in this script "
             "from src/core/hw.c")
EOF

for v in floor nofloor; do
    echo "grid and case study with $v.json ..." >&2
    "$BS" simulate --grid --hardware "$OUT/$v.json" --policy "$POLICIES" --out "$OUT/grid-$v" --no-plot >&2
    "$BS" simulate --scenario case-study --hardware "$OUT/$v.json" --policy "$POLICIES" --json > "$OUT/case-study-$v.json"
done

"$PY" - "$OUT" "$POLICIES" <<'EOF'
import csv, json, math, sys
out, policies = sys.argv[1], sys.argv[2].split(",")

def grid(v):
    cells = {}
    for r in csv.DictReader(open(f"{out}/grid-{v}/paper-grid.csv")):
        cells[(r["scenario"], r["policy"])] = (float(r["tokens_per_s_mean"]), float(r["speedup_vs_static_mean"]))
    return cells

def case(v):
    d = json.load(open(f"{out}/case-study-{v}.json"))
    return {r["policy"]: r for r in d["results"]}

def si(x):
    return f"{x / 1e6:.3f}M" if x >= 1e6 else f"{x / 1e3:.1f}K"

on, off = grid("floor"), grid("nofloor")
scen = sorted({s for s, _ in on}, key=lambda s: list(k[0] for k in on).index(s))
print("## Paper grid, h100-measured: mean tokens/s over 8 seeds, with the floor / without\n")
print("| policy | cells | tokens/s with / without: geo. mean | min | max | speedup over static with the floor: "
      "geo. mean [min-max] | without |")
print("|---|---:|---:|---:|---:|---:|---:|")
for p in policies:
    keys = [(s, p) for s in scen if (s, p) in on and (s, p) in off]
    if not keys:
        continue
    moves = [on[k][0] / off[k][0] for k in keys]
    sp_on, sp_off = [on[k][1] for k in keys], [off[k][1] for k in keys]
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"| {p} | {len(keys)} | {g(moves):.3f} | {min(moves):.3f} | {max(moves):.3f} | "
          f"{g(sp_on):.2f}x [{min(sp_on):.2f}-{max(sp_on):.2f}] | {g(sp_off):.2f}x [{min(sp_off):.2f}-{max(sp_off):.2f}] |")

print("\nCells where the floor moves static the most (tokens/s with / without):\n")
moved = sorted(((on[(s, "static")][0] / off[(s, "static")][0], s) for s in scen if (s, "static") in on), key=lambda x: x[0])
print("| scenario | static with / without | balance with / without | balance over static with | without |")
print("|---|---:|---:|---:|---:|")
for m, s in moved[:6]:
    b = on.get((s, "balance")), off.get((s, "balance"))
    if b[0] and b[1]:
        print(f"| {s} | {m:.3f} | {b[0][0] / b[1][0]:.3f} | {b[0][1]:.2f}x | {b[1][1]:.2f}x |")

con, coff = case("floor"), case("nofloor")
print("\n## Case study (LLaMA-7B, 1,024 GPUs, Byted, 2M), h100-measured, mean over 8 seeds\n")
print("| policy | tokens/s with the floor | without | with / without | vs static with | without |")
print("|---|---:|---:|---:|---:|---:|")
def tps(r):
    return r["mean"]["tokens_per_s"]
def spd(r):
    return r["mean"]["speedup_vs_static"]
for p in policies:
    if p in con and p in coff:
        a, b = con[p], coff[p]
        print(f"| {p} | {si(tps(a))} | {si(tps(b))} | {tps(a) / tps(b):.3f} | {spd(a):.2f}x | {spd(b):.2f}x |")
EOF
