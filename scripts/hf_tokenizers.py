"""hf_tokenizers.py: Hugging Face tokenizer.json files made offline, and their encodings by the
Hugging Face `tokenizers` library (pip), for the hf: tokenizer's tests to compare with.

    .venv/bin/python scripts/hf_tokenizers.py --ranks-dir data/tiktoken --out-dir data/tiktoken \
        [--corpus /usr/share/go-1.19/src] [--every 10] [--only gpt2,llama3,o200k,trained]

No model hub is reached: each tokenizer.json is written here. Three convert tiktoken's rank files
the way transformers' TikTokenConverter does (each token's merge is recovered by running the BPE
on its bytes with the ranks below its own), in the shapes of the families bytescale reads:

    hf-gpt2.json     r50k_base's ranks, pre-tokenizer ByteLevel (GPT-2's own regex), <|endoftext|>
    hf-llama3.json   cl100k_base's ranks, Split by LLaMA-3's regex then ByteLevel, ignore_merges,
                     <|begin_of_text|> and <|end_of_text|> (LLaMA-3's shape; its vocabulary is
                     cl100k's plus 28K tokens)
    hf-o200k.json    o200k_base's ranks, Split by o200k's regex then ByteLevel
    hf-qwen2.json    cl100k_base's ranks in the Qwen2 family's shape: the NFC normalizer, Split by
                     Qwen2's regex (digits one by one) then ByteLevel, Qwen2's special tokens and
                     Qwen2.5's added tokens that are not special (<tool_call>, <|fim_prefix|>, ...,
                     matched in text); Qwen2's own vocabulary is cl100k's plus 51K tokens
    hf-trained.json  a byte-level BPE of 2,000 tokens trained by the library's own BpeTrainer on
                     every 50th Go file, ByteLevel with add_prefix_space: its merges are the
                     trainer's, not a rank file's

Then vectors-hf-<name>.jsonl: the documents of tiktoken_vectors.py (cases, multilingual samples
with Debian's, every EVERY-th Go file), {"name", "text", "ids"}, the ids from the library's
encode_batch with add_special_tokens=False and encode_special_tokens=True (special-token text is
ordinary text, as bytescale treats it). For a tokenizer with a normalizer (hf-qwen2.json's NFC) each
line also holds "normalized", the library's normalized text: what the ids decode to.
"""

import argparse
import base64
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiktoken_vectors as tv  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN25_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>"]
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])


def bytes_to_unicode():
    """GPT-2's map from bytes to the characters that spell them in a byte-level vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def recover_merges(ranks):
    """Each token's two parts: its bytes merged with only the ranks below its own (TikTokenConverter)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, (token, parts)
        merges.append((parts[0], parts[1]))
    return merges


def converted_json(ranks, pre_tokenizer, specials, ignore_merges, plain=(), normalizer=None):
    """specials: (text, id) of the special tokens; plain: (text, id) of added tokens that are not
    special (matched in text by the library)."""
    m = bytes_to_unicode()
    spell = lambda b: "".join(m[x] for x in b)  # noqa: E731
    vocab = {spell(t): r for t, r in ranks.items()}
    merges = [[spell(a), spell(b)] for a, b in recover_merges(ranks)]
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": special} for special, group in ((True, specials), (False, plain)) for c, i in group]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}


def split_then_bytelevel(pattern, trim_offsets=True):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": False}]}


def trained_json(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [t for _, t in tv.go_documents(corpus, 50)]
    tok.train_from_iterator(texts, trainer=trainer)
    return json.loads(tok.to_str())


def make_json(name, ranks_dir, corpus):
    if name == "gpt2":
        ranks = load_ranks(os.path.join(ranks_dir, "r50k_base.tiktoken"))
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        return converted_json(ranks, pre, [("<|endoftext|>", 50256)], False)
    if name == "llama3":
        ranks = load_ranks(os.path.join(ranks_dir, "cl100k_base.tiktoken"))
        return converted_json(ranks, split_then_bytelevel(LLAMA3_PATTERN),
                              [("<|begin_of_text|>", 100256), ("<|end_of_text|>", 100257)], True)
    if name == "qwen2":
        ranks = load_ranks(os.path.join(ranks_dir, "cl100k_base.tiktoken"))
        ids = iter(range(len(ranks), len(ranks) + len(QWEN2_SPECIAL) + len(QWEN25_ADDED)))
        specials = [(c, next(ids)) for c in QWEN2_SPECIAL]
        plain = [(c, next(ids)) for c in QWEN25_ADDED]
        return converted_json(ranks, split_then_bytelevel(QWEN2_PATTERN, trim_offsets=False), specials, False,
                              plain, {"type": "NFC"})
    if name == "o200k":
        ranks = load_ranks(os.path.join(ranks_dir, "o200k_base.tiktoken"))
        return converted_json(ranks, split_then_bytelevel(O200K_PATTERN), [("<|endoftext|>", 199999)], False)
    return trained_json(corpus)


def write_vectors(json_path, docs, out):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(json_path)
    tok.encode_special_tokens = True
    encs = tok.encode_batch([t for _, t in docs], add_special_tokens=False)
    n_tokens = 0
    with open(out, "w", encoding="utf-8") as f:
        for (name, text), e in zip(docs, encs):
            n_tokens += len(e.ids)
            doc = {"name": name, "text": text, "ids": e.ids}
            if tok.normalizer is not None:  # the text the ids decode to: the library's normalized text
                doc["normalized"] = tok.normalizer.normalize_str(text)
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return n_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--corpus", default="/usr/share/go-1.19/src")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--only", default="gpt2,llama3,o200k,qwen2,trained")
    ap.add_argument("--json-only", action="store_true", help="write the tokenizer.json files, no vectors")
    a = ap.parse_args()
    from importlib.metadata import version

    docs = [(f"case {i}", t) for i, t in enumerate(tv.CASES)]
    docs += [(f"multilingual {i}", t) for i, t in enumerate(tv.MULTILINGUAL)]
    docs += [(f"multilingual {n}", t) for n, t in tv.debian_documents()]
    docs += list(tv.go_documents(a.corpus, a.every))
    for name in a.only.split(","):
        path = os.path.join(a.out_dir, f"hf-{name}.json")
        if not os.path.exists(path):
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(make_json(name, a.ranks_dir, a.corpus), f, ensure_ascii=False)
            os.replace(tmp, path)
        if a.json_only:
            continue
        out = os.path.join(a.out_dir, f"vectors-hf-{name}.jsonl")
        n = write_vectors(path, docs, out + ".tmp")
        os.replace(out + ".tmp", out)
        print(f"hf-{name}: tokenizers {version('tokenizers')} encoded {len(docs)} documents, {n} tokens -> {out}")


if __name__ == "__main__":
    main()
