#!/bin/bash
# plans_identical_random.sh OLD_BINARY NEW_BINARY [N] [SEED] [DIR]: writes the plan file of every
# policy for N random batches (default 20) with both binaries and compares them byte for byte, so a
# change meant to keep behaviour (a refactor) can be shown to keep every plan. Each batch draws its
# seed, length distribution, model, HDP ranks, tp x pp, capacity, context, token budget and
# offloading from bash's RANDOM seeded with SEED (default 1): the same SEED gives the same batches.
# A set-up both binaries refuse counts as identical when their messages are the same (it is printed).
# flexsp plans under a GLPK time limit, so on a loaded machine its plans may differ between two runs
# of the same binary: a differing flexsp plan is run again (up to 3 times) before it counts.
set -eu
old=$1 new=$2 n=${3:-20} seed=${4:-1} dir=${5:-$(mktemp -d)}
mkdir -p "$dir"
policies="static naive naive-eq3min balance elastic megatron-hcp wlb flexsp blocks blocks-all"
RANDOM=$seed
pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }

# one plan with both binaries; 0 when the files (or both refusals) are the same
same() {
  local tag=$1; shift
  local orc=0 nrc=0
  "$old" plan "$@" --out "$dir/old-$tag.json" > /dev/null 2> "$dir/old-$tag.err" || orc=$?
  "$new" plan "$@" --out "$dir/new-$tag.json" > /dev/null 2> "$dir/new-$tag.err" || nrc=$?
  [ "$orc" -eq "$nrc" ] || return 1
  if [ "$orc" -ne 0 ]; then
    cmp -s "$dir/old-$tag.err" "$dir/new-$tag.err" || return 1
    echo "both refuse $tag: $(head -c 160 "$dir/new-$tag.err")"
    refused=$((refused + 1))
    return 0
  fi
  cmp -s "$dir/old-$tag.json" "$dir/new-$tag.json"
}

total=0 differ=0 refused=0 reruns=0
for b in $(seq 1 "$n"); do
  bseed=$((RANDOM * 32768 + RANDOM))
  dist=$(pick byted github uniform:1K:64K lognormal:8:1.5 fixed:12K)
  model=$(pick llama-7b llama-13b llama-70b)
  ranks=$(pick 4 8 16 32 64 128)
  layout=$(pick "--tp 1 --pp 1" "--tp 2 --pp 1" "--tp 4 --pp 2" "--tp 8 --pp 1" "--tp 2 --pp 4")
  cap=$(pick 4K 8K 16K 32K)
  ctx=$(pick 64 128 256 512)  # K tokens
  # enough ranks for the longest sequence without offloading (wlb, blocks and the 2^k groups need it)
  while [ $((ranks * ${cap%K})) -lt $((ctx * 2)) ]; do ranks=$((ranks * 2)); done
  ctx=${ctx}K
  tokens=$(pick 1M 2M 4M 8M)
  off=$(pick "" "" --no-offload)  # offloading is the default; static never offloads and takes neither flag
  args="--dist $dist --seed $bseed --model $model --ranks $ranks $layout --capacity $cap --context $ctx --tokens $tokens"
  echo "batch $b: $args $off"
  for pol in $policies; do
    tag="b$b-$pol"
    total=$((total + 1))
    ok=0
    [ "$pol" = static ] && pargs=$args || pargs="$args $off"
    # shellcheck disable=SC2086
    if same "$tag" --policy "$pol" $pargs; then ok=1; fi
    for try in 1 2 3; do  # GLPK's time limit: flexsp alone may differ from run to run
      [ "$ok" -eq 0 ] && [ "$pol" = flexsp ] || break
      reruns=$((reruns + 1))
      echo "flexsp differs on batch $b, run $((try + 1))"
      # shellcheck disable=SC2086
      if same "$tag" --policy "$pol" $pargs; then ok=1; fi
    done
    if [ "$ok" -eq 0 ]; then echo "DIFFERS: $tag ($pargs)"; differ=$((differ + 1)); fi
  done
done
echo "$total plan files compared ($n batches x 10 policies, seed $seed): $differ differ," \
  "$refused refused alike by both, $reruns flexsp re-runs; files in $dir"
[ "$differ" -eq 0 ]
