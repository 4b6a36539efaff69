"""tiktoken_vectors.py: documents and their encodings by tiktoken, for the tokenizer tests to compare with.

    .venv/bin/python scripts/tiktoken_vectors.py --ranks-dir data/tiktoken --encoding r50k_base \
        --out data/tiktoken/vectors-r50k_base.jsonl [--corpus /usr/share/go-1.19/src] [--every 10]

The reference is tiktoken (pip), never bytescale's own tokenizer: tiktoken's own constructor for the
encoding (its split pattern, special tokens and the published sha256 of the rank file), reading the
local rank file through tiktoken's cache (TIKTOKEN_CACHE_DIR, keyed by the sha1 of the URL it would
download from), so nothing is downloaded. Each output line is one document:

    {"name": "...", "text": "...", "ids": [...]}

The documents: hand-written cases of the split pattern's corners (contractions, digit runs, runs of
spaces and newlines, punctuation), a multilingual sample (CJK, Hangul, Arabic, Devanagari, Thai,
emoji with joiners and skin tones, combining marks), and every EVERY-th Go source file of the corpus
in path order. With --debian-samples (what `make tokenizer` passes), the multilingual sample also
takes Debian's own test data: the UTF-8 texts of Python's CJK codec tests (libpython3.11-testsuite:
test/cjkencodings/*-utf8.txt, Chinese, Japanese, Korean), Unicode's emoji-test.txt (unicode-data:
every emoji, with joiners, skin tones and flags) and the code point sequences of Unicode's
NormalizationTest.txt (unicode-data: combining marks, Hangul jamo, precomposed letters), in pieces. Encoded with encode_ordinary: special-token text is ordinary text, as bytescale's
tokenizers treat it.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile

CASES = [
    "", " ", "  ", "\n", "\n\n\n", " \n ", "\t\tx", "a  b", "a   \n  b", "trailing   ",
    "Hello, world!", "hello world", "HELLO WORLD", "I'm you're we've he'll she'd it's DON'T", "'s 't",
    "1234567890 12 123 1234 3.14159 -42 0x1F 1e10", "a1b2c3", "$$$ ... !!! ??? --- ***",
    "line one\r\nline two\rline three\n", "<|endoftext|> is text here", "tab\tseparated\tvalues\t",
    "func main() {\n\tfmt.Println(\"hi\")\n}\n", "x := []int{1, 2, 3}", "// comment\n/* block */",
    # the added tokens of hf-qwen2.json (scripts/hf_tokenizers.py): next to each other, inside words,
    # one inside another's text, cut short, beside special-token text and combining marks
    "<tool_call>{\"name\": \"f\"}</tool_call>", "a<|fim_prefix|>b<|fim_suffix|>c<|fim_middle|>d<|fim_pad|>",
    "<<tool_call>> <tool_call</tool_call>> <tool_cal", "<|im_start|>user\n<|repo_name|>x<|file_sep|>e\u0301<|im_end|>",
    "\u0301<tool_call>\u0301 A\u030a<tool_call>",
]

MULTILINGUAL = [
    "日本語のテキストと漢字、ひらがな、カタカナ。", "中文文本：你好，世界！", "한국어 텍스트입니다.",
    "العربية نص قصير", "हिन्दी पाठ", "ภาษาไทย", "Ελληνικά κείμενο", "Русский текст, ёлка.",
    "emoji 👋🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷", "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "Zalgo: Z\u0351\u036b\u0343a\u0352l\u0310g\u0300o", "naïve café résumé Æsir ß ŉ",
    "mixed 日本 English 123 한국 ✓", "\u00a0non-breaking\u2003em space\u3000ideographic",
]

URLS = {
    "r50k_base": "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}


def reference_encoding(name, ranks_dir, cache_dir):
    """tiktoken's own encoding `name`, its rank file read from ranks_dir through tiktoken's cache."""
    os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    key = hashlib.sha1(URLS[name].encode()).hexdigest()
    os.symlink(os.path.abspath(os.path.join(ranks_dir, name + ".tiktoken")), os.path.join(cache_dir, key))
    import tiktoken

    return tiktoken.get_encoding(name)


PY_CJK = "/usr/lib/python3.11/test/cjkencodings"
EMOJI_TEST = "/usr/share/unicode/emoji/emoji-test.txt"
NORMALIZATION_TEST = "/usr/share/unicode/NormalizationTest.txt.bz2"


def debian_documents():
    """The multilingual sample from Debian's packages (see the module's doc); missing ones are an error."""
    import bz2

    for need in (PY_CJK, EMOJI_TEST, NORMALIZATION_TEST):
        if not os.path.exists(need):
            sys.exit(f"tiktoken_vectors.py: {need} is missing (apt-get install libpython3.11-testsuite unicode-data; "
                     "make deps does)")
    for f in sorted(os.listdir(PY_CJK)):
        if f.endswith("-utf8.txt"):
            with open(os.path.join(PY_CJK, f), encoding="utf-8") as fh:
                yield f"python-cjk {f}", fh.read()
    with open(EMOJI_TEST, encoding="utf-8") as fh:
        lines = fh.readlines()
    for i in range(0, len(lines), 500):
        yield f"emoji-test lines {i + 1}-{min(i + 500, len(lines))}", "".join(lines[i:i + 500])
    # each test line: five columns of code point sequences; a document is 400 lines of them, as text
    rows = []
    with bz2.open(NORMALIZATION_TEST, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("@"):
                continue
            cols = line.split(";")[:5]
            rows.append(" ".join("".join(chr(int(h, 16)) for h in c.split()) for c in cols))
    for i in range(0, len(rows), 400):
        yield f"normalization-test rows {i + 1}-{min(i + 400, len(rows))}", "\n".join(rows[i:i + 400]) + "\n"


def go_documents(corpus, every):
    paths = []
    for root, dirs, files in os.walk(corpus):
        dirs.sort()
        paths += [os.path.join(root, f) for f in sorted(files) if f.endswith(".go")]
    for p in sorted(paths)[::every]:
        with open(p, "rb") as f:
            raw = f.read()
        try:
            yield os.path.relpath(p, corpus), raw.decode("utf-8")
        except UnicodeDecodeError:
            continue  # tiktoken takes text: a file that is not UTF-8 is left out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks-dir", required=True)
    ap.add_argument("--encoding", required=True, choices=sorted(URLS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default="/usr/share/go-1.19/src")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--debian-samples", action="store_true",
                    help="add the multilingual sample from Debian's packages (Python's CJK tests, Unicode's data)")
    a = ap.parse_args()
    if not os.path.isdir(a.corpus):
        sys.exit(f"tiktoken_vectors.py: no corpus at {a.corpus} (apt-get install golang-1.19-src; make deps does)")
    with tempfile.TemporaryDirectory() as cache:
        enc = reference_encoding(a.encoding, a.ranks_dir, cache)
        docs = [(f"case {i}", t) for i, t in enumerate(CASES)]
        docs += [(f"multilingual {i}", t) for i, t in enumerate(MULTILINGUAL)]
        if a.debian_samples:
            docs += [(f"multilingual {name}", t) for name, t in debian_documents()]
        docs += list(go_documents(a.corpus, a.every))
        n_tokens = 0
        with open(a.out, "w", encoding="utf-8") as out:
            for i, (name, text) in enumerate(docs):
                ids = enc.encode_ordinary(text)
                n_tokens += len(ids)
                out.write(json.dumps({"name": name, "text": text, "ids": ids}, ensure_ascii=False) + "\n")
                if i % 100 == 0 or i == len(docs) - 1:
                    print(f"\r{a.encoding}: {i + 1}/{len(docs)} documents, {n_tokens} tokens", end="", flush=True)
        print(f"\n{a.encoding}: tiktoken {tiktoken_version()} encoded {len(docs)} documents, {n_tokens} tokens -> {a.out}")


def tiktoken_version():
    from importlib.metadata import version

    return version("tiktoken")


if __name__ == "__main__":
    main()
