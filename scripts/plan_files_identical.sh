#!/bin/sh
# plan_files_identical.sh OLD_BINARY NEW_BINARY [DIR]: writes the plan file of every policy for a few
# batches (two length distributions, three seeds, a TP and a PP layout) with both binaries and
# compares them byte for byte (a change to the plan format must leave every existing plan as it was).
set -eu
old=$1 new=$2 dir=${3:-$(mktemp -d)}
mkdir -p "$dir"
policies="static naive naive-eq3min balance elastic megatron-hcp wlb flexsp blocks blocks-all"
n=0 diff=0
for pol in $policies; do
  for dist in byted github; do
    for seed in 1 2 3; do
      for layout in "--tp 2 --pp 1" "--tp 8 --pp 2"; do
        args="--policy $pol --dist $dist --seed $seed --tokens 4M --context 256K --ranks 64 --capacity 16K $layout"
        tag=$(echo "$pol-$dist-$seed-$layout" | tr ' ' '_')
        $old plan $args --out "$dir/old-$tag.json" > /dev/null
        $new plan $args --out "$dir/new-$tag.json" > /dev/null
        n=$((n + 1))
        if ! cmp -s "$dir/old-$tag.json" "$dir/new-$tag.json"; then echo "differs: $tag"; diff=$((diff + 1)); fi
      done
    done
  done
done
echo "$n plan files compared, $diff differ"
[ "$diff" -eq 0 ]
