#!/bin/bash
# short_sequences.sh OLD_BINARY NEW_BINARY [DIR]: issue 42's table, many short sequences a rank, with
# two builds in one run: `bytescale plan --lengths FILE --ranks R --context 64K` for the lengths
# (i x 7919) % 4000 + 1 (the first N of 10M, written to DIR once), elastic and balance, each binary.
# Prints the planning time ("planned in", median of 3 runs; 1 run of OLD's elastic at 10M, which
# took minutes before issue 42) and the process's peak resident set (/usr/bin/time %M), pinned to
# core 1. A run over 900 s counts as "> 900 s". Rows: 125K, 250K, 500K, 1M on 512 ranks, 1M on
# 4,096, 10M on 512 and 16,384.
set -u
old=$1 new=$2 dir=${3:-/tmp/bs-short}
mkdir -p "$dir"
[ -s "$dir/10m.txt" ] || awk 'BEGIN { for (i = 1; i <= 10000000; i++) print (i * 7919) % 4000 + 1 }' > "$dir/10m.txt"

# one configuration K times: "median-ms peak-MB"
run() {
  local bin=$1 pol=$2 file=$3 ranks=$4 k=$5 ms=() peak=0 out t r
  for _ in $(seq "$k"); do
    out=$( { /usr/bin/time -f "RSS %M" timeout 900 taskset -c 1 "$bin" plan --lengths "$file" --ranks "$ranks" \
             --context 64K --policy "$pol"; } 2>&1 )
    t=$(echo "$out" | sed -n 's/^planned in \([0-9.]*\) ms/\1/p')
    r=$(echo "$out" | sed -n 's/^RSS \([0-9]*\)/\1/p')
    ms+=("${t:-900000}")
    [ "${r:-0}" -gt "$peak" ] && peak=$r
  done
  printf "%s %d\n" "$(printf "%s\n" "${ms[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')" \
    $((peak / 1024))
}

cell() { awk -v ms="$1" -v mb="$2" 'BEGIN { if (ms >= 900000) printf "> 900 s"; else printf "%.0f ms (%d MB)", ms, mb }'; }

echo "| sequences | ranks | before: elastic | before: balance | after: elastic | after: balance | after: elastic / balance |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for row in 125000:512 250000:512 500000:512 1000000:512 1000000:4096 10000000:512 10000000:16384; do
  n=${row%:*} ranks=${row#*:}
  file=$dir/$n.txt
  [ -s "$file" ] || head -n "$n" "$dir/10m.txt" > "$file"
  k_old=3; [ "$n" -ge 10000000 ] && k_old=1
  read -r oe oem <<< "$(run "$old" elastic "$file" "$ranks" $k_old)"
  read -r ob obm <<< "$(run "$old" balance "$file" "$ranks" 3)"
  read -r ne nem <<< "$(run "$new" elastic "$file" "$ranks" 3)"
  read -r nb nbm <<< "$(run "$new" balance "$file" "$ranks" 3)"
  echo "| $n | $ranks | $(cell "$oe" "$oem") | $(cell "$ob" "$obm") | $(cell "$ne" "$nem") | $(cell "$nb" "$nbm") |" \
       "$(awk -v a="$ne" -v b="$nb" 'BEGIN { printf "%.2f", a / b }') |"
done
