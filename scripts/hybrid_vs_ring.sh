#!/bin/sh
# hybrid_vs_ring.sh [BINARY]: one sequence on 16 ranks (LLaMA-7B, TP 2, h100-measured: 4 ranks a node)
# as a ring of 16 (u = 0) and as hybrids of u = 2, 4, 8 (a ring of 16 / u Ulysses groups), simulated
# from hand-written plan files (`simulate --plan`): the simulated step's compute end and the bytes moved.
set -eu
bin=${1:-build/bytescale}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf "%8s %4s %14s %12s\n" tokens u compute_end_s ring_bytes
for L in 16384 65536 262144; do
  for u in 0 2 4 8; do
    extra=""
    [ "$u" -gt 0 ] && extra=", \"ulysses\": $u"
    cat > "$dir/p.json" <<JSON
{"version": 1, "policy": "hand", "n_ranks": 16, "pp": 1, "capacity": 16384, "makespan": 0, "lower_bound": 0,
 "sequences": [{"id": 0, "len": $L, "src": -1}],
 "items": [{"ranks": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], "offload": 0,
            "segments": [[0, 0, $L]], "est_time": 0$extra}]}
JSON
    $bin simulate --plan "$dir/p.json" --model llama-7b --hardware h100-measured --tp 2 --json |
      python3 -c "import json, sys; r = json.load(sys.stdin); print('%8d %4d %14.4f %12.3g' % ($L, $u, r['compute_end'], r['ring_bytes']))"
  done
done
