"""Real corpora through `bytescale prepare` and back through bytescale.torch's Dataset, checked against
the reference libraries, never against bytescale's own tokenizer: a JSONL.zst corpus with cl100k
gives tiktoken's ids line by line; hf:tokenizer.json gives the Hugging Face tokenizers library's;
tokenizer.json kinds bytescale does not read are refused by name; a parquet file gives the dataset
the same rows give as JSONL.

The sample: every 40th .go file of /usr/share/go-1.19/src, the hand-written cases and the
multilingual samples of scripts/tiktoken_vectors.py (Debian's included). The rank files and
tokenizer.json files come from `make tokenizer` (data/tiktoken).
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bytescale.torch.data import Dataset
from test_torch_run import spawning_main

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "tiktoken"
sys.path.insert(0, str(ROOT / "scripts"))
import tiktoken_vectors as tv  # noqa: E402


def need(*names):
    for n in names:
        if not (DATA / n).exists():
            pytest.skip(f"data/tiktoken/{n} is missing (`make tokenizer` makes it)")


@pytest.fixture(scope="module")
def texts():
    docs = list(tv.CASES) + list(tv.MULTILINGUAL) + [t for _, t in tv.debian_documents()]
    docs += [t for _, t in tv.go_documents("/usr/share/go-1.19/src", 40)]
    return docs


def write_jsonl_zst(path, texts):
    plain = str(path)[:-4]
    with open(plain, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
    subprocess.run(["zstd", "-q", "-f", "--rm", plain, "-o", str(path)], check=True)


def prepare(cli, *args):
    r = subprocess.run([cli, "prepare", *map(str, args)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "BS_QUIET": "1"})
    return r


def test_jsonl_zst_cl100k_dataset_is_tiktoken(cli, tmp_path, texts):
    need("cl100k_base.tiktoken")
    src = tmp_path / "corpus.jsonl.zst"
    write_jsonl_zst(src, texts)
    r = prepare(cli, "--input", src, "--tokenizer", "cl100k", "--bpe-ranks", DATA / "cl100k_base.tiktoken",
                "--out", tmp_path / "ds", "--threads", 2)
    assert r.returncode == 0, r.stderr
    with __import__("tempfile").TemporaryDirectory() as cache:
        enc = tv.reference_encoding("cl100k_base", str(DATA), cache)
        ds = Dataset(tmp_path / "ds")
        assert ds.n_docs == len(texts)  # one per line
        assert (ds.tokenizer, ds.vocab, ds.width) == (3, enc.n_vocab, 4)
        tokens = 0
        for d, text in enumerate(texts):
            want = enc.encode_ordinary(text) + ([enc.eot_token] if text else [])
            got = ds.read(d, 0, ds.doc_length(d))
            assert got.tolist() == want, f"document {d} ({text[:40]!r})"
            tokens += len(want)
    print(f"cl100k: {len(texts)} documents, {tokens} tokens equal to tiktoken's (end-of-document tokens included)")


# llama3: LLaMA-3's shape; qwen2: Qwen2's, with the NFC normalizer and added tokens matched in text
@pytest.mark.parametrize("name,eot_text", [("llama3", "<|end_of_text|>"), ("qwen2", "<|endoftext|>")])
def test_hf_tokenizer_json_dataset_is_hf_tokenizers(cli, tmp_path, texts, name, eot_text):
    need(f"hf-{name}.json")
    from tokenizers import Tokenizer

    src = tmp_path / "corpus.jsonl.zst"
    write_jsonl_zst(src, texts)
    r = prepare(cli, "--input", src, "--tokenizer", f"hf:{DATA / f'hf-{name}.json'}", "--out", tmp_path / "ds")
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.from_file(str(DATA / f"hf-{name}.json"))
    tok.encode_special_tokens = True
    eot = tok.token_to_id(eot_text)
    ds = Dataset(tmp_path / "ds")
    assert ds.n_docs == len(texts) and ds.tokenizer == 5 and ds.vocab == tok.get_vocab_size()
    for d, (text, e) in enumerate(zip(texts, tok.encode_batch(texts, add_special_tokens=False))):
        assert ds.read(d, 0, ds.doc_length(d)).tolist() == e.ids + ([eot] if text else []), f"document {d}"


def save(tok, path):
    tok.save(str(path))
    return path


def test_hf_refuses_other_kinds_by_name(cli, tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    uni = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0))
    nfkc = Tokenizer(models.BPE({"a": 0}, []))
    nfkc.normalizer = normalizers.NFKC()
    nfkc.pre_tokenizer = pre_tokenizers.ByteLevel()
    cases = [(wp, "a WordPiece model (BERT-style)"), (uni, "a SentencePiece unigram model"),
             (nfkc, 'normalizer "NFKC" is not supported (bytescale reads none, or NFC)')]
    # added tokens matched in text that strip spaces or match whole words, or are matched in the
    # normalized text, in a copy of hf-qwen2.json
    if (DATA / "hf-qwen2.json").exists():
        qwen2 = json.loads((DATA / "hf-qwen2.json").read_text(encoding="utf-8"))
        for flag, msg in [("lstrip", "has lstrip"), ("single_word", "has single_word"),
                          ("normalized", "is matched in NFC-normalized text")]:
            doc = json.loads(json.dumps(qwen2))
            next(a for a in doc["added_tokens"] if a["content"] == "<tool_call>")[flag] = True
            cases.append((doc, f'added token "<tool_call>" {msg}'))
    for i, (tok, msg) in enumerate(cases):
        path = tmp_path / f"t{i}.json"
        if isinstance(tok, dict):
            path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
        else:
            save(tok, path)
        r = prepare(cli, "--input", tmp_path / "a.jsonl", "--tokenizer", f"hf:{path}", "--out", tmp_path / "o")
        assert r.returncode == 1 and msg in r.stderr and str(path) in r.stderr, r.stderr
    assert not (tmp_path / "o" / "index.bin").exists()


def test_nfc_table_is_unicode_since_9_and_the_library_is_at_9():
    """tok_hf.c normalizes as the HF library does, whose NFC has Unicode 9.0's tables: its table of the
    characters later versions made part of normalization is the one Debian's unicode-data gives
    (scripts/unicode_since9.py), and to the library those characters are indeed unassigned, while
    9.0's are not. A library with newer tables fails this, naming the table to change."""
    import re
    import unicodedata

    import unicode_since9
    from tokenizers import normalizers

    src = (ROOT / "src" / "data" / "tok_hf.c").read_text()
    table = src[src.index("SINCE_9[][2] = {"):src.index("};", src.index("SINCE_9[][2] = {"))]
    got = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", table)]
    assert got == unicode_since9.ranges(), "tok_hf.c's SINCE_9: print it again with scripts/unicode_since9.py --c"
    nfc = normalizers.NFC()
    for first, last in got:
        for cp in range(first, last + 1):
            c = chr(cp)
            # unassigned to the library: no reordering before a mark of class 220, no decomposition
            assert nfc.normalize_str("a" + c + "\u0316") == "a" + c + "\u0316", hex(cp)
            assert nfc.normalize_str(c) == c, hex(cp)
    # a combining mark of Unicode 9.0 (Adlam, class 230) is known to it: reordered after U+0316
    assert unicodedata.combining("\U0001E944") == 230
    assert nfc.normalize_str("a\U0001E944\u0316") == "a\u0316\U0001E944"


def test_parquet_gives_the_jsonl_dataset(cli, tmp_path, texts):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bytescale.parquet import prepare_parquet

    need("cl100k_base.tiktoken")
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    pq.write_table(table, tmp_path / "corpus.parquet", row_group_size=97)
    write_jsonl_zst(tmp_path / "corpus.jsonl.zst", texts)
    ranks = DATA / "cl100k_base.tiktoken"
    out = prepare_parquet([tmp_path / "corpus.parquet"], tmp_path / "pq", tokenizer="cl100k", bpe_ranks=ranks,
                          command=cli)
    assert f"into {len(texts)} documents" in out
    r = prepare(cli, "--input", tmp_path / "corpus.jsonl.zst", "--tokenizer", "cl100k", "--bpe-ranks", ranks,
                "--out", tmp_path / "js")
    assert r.returncode == 0, r.stderr
    a, b = Dataset(tmp_path / "pq"), Dataset(tmp_path / "js")
    assert (a.n_docs, a.n_tokens, a.vocab, a.tokenizer) == (b.n_docs, b.n_tokens, b.vocab, b.tokenizer)
    assert np.array_equal(a.doc_len, b.doc_len) and np.array_equal(a.doc_offset, b.doc_offset)
    for s in sorted(os.listdir(tmp_path / "js")):
        if s.startswith("shard-"):
            assert (tmp_path / "pq" / s).read_bytes() == (tmp_path / "js" / s).read_bytes()
    # a null row stops the run naming the file and row, like a bad JSONL line
    pq.write_table(pa.table({"text": ["a", None, "b"]}), tmp_path / "null.parquet")
    with pytest.raises(RuntimeError, match=r'null.parquet:2: field "text" is null, not a string'):
        prepare_parquet([tmp_path / "null.parquet"], tmp_path / "n", command=cli)
    out = prepare_parquet([tmp_path / "null.parquet"], tmp_path / "n", skip_bad_lines=True, command=cli)
    assert "into 2 documents" in out and "skipped 1 bad line" in out


def test_torch_trains_from_cl100k_jsonl_zst(cli, tmp_path, texts):
    """examples/torch_hdp_train.py on 2 processes, from a JSONL.zst corpus prepared with cl100k: the
    model's vocabulary is the dataset's (100277), and the loss starts near ln(100277)."""
    need("cl100k_base.tiktoken")
    write_jsonl_zst(tmp_path / "c.jsonl.zst", texts[:60])
    r = prepare(cli, "--input", tmp_path / "c.jsonl.zst", "--tokenizer", "cl100k", "--bpe-ranks",
                DATA / "cl100k_base.tiktoken", "--out", tmp_path / "ds")
    assert r.returncode == 0, r.stderr
    # `python examples/torch_hdp_train.py`: its main() here, its ranks forked from this process's server
    assert spawning_main("torch_hdp_train", "--data", tmp_path / "ds", "--model", "tiny", "--context", "256",
                         "--capacity", "256", "--tokens", "512", "--steps", "2", "--warmup", "1", "--nproc", "2",
                         "--metrics", tmp_path / "m.jsonl") == 0
    losses = [json.loads(x)["loss"] for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and abs(losses[0] - np.log(100277)) < 0.5, losses
    from bytescale.torch import LlamaConfig
    assert LlamaConfig.for_dataset("tiny", Dataset(tmp_path / "ds"), tp=2).vocab_size == 100278


def test_jsonl_lines_read_as_pythons_json_reads_them(cli, tmp_path):
    """2,000 JSONL lines, valid and broken (escapes, surrogate pairs, NUL, nesting, truncations, flipped
    bytes), prepared with the byte tokenizer and --skip-bad-lines: the documents are exactly the lines
    Python's json module (strict UTF-8, objects only, no NaN) takes, each the UTF-8 of its "text"."""
    rng = np.random.default_rng(40)
    alphabet = ["a", " ", "\n", "\t", '"', "\\", "/", "\0", "\x1f", "é", "世", "😀", "\u0301", "\u2028", "\ud7ff", "x" * 40]

    def text():
        return "".join(rng.choice(alphabet) for _ in range(rng.integers(0, 12)))

    def good():
        obj = {"id": int(rng.integers(1 << 40)), "text": text(), "meta": {"a": [1.5e-3, None, True, {"b": text()}]}}
        if rng.random() < 0.3:
            obj = {"text": "shadowed", **obj}  # a repeated key: the last one counts, as in Python
        return json.dumps(obj, ensure_ascii=bool(rng.random() < 0.5)).encode()

    lines = []
    for i in range(2000):
        line = good()
        kind = rng.random()
        if kind < 0.15:
            line = line[:int(rng.integers(0, len(line)))]
        elif kind < 0.3:
            at = int(rng.integers(0, len(line)))
            b = int(rng.integers(0, 256))
            line = line[:at] + bytes([b if b != 10 else 11]) + line[at + 1:]
        elif kind < 0.35:
            line = rng.choice([b'{"text": "\\ud800"}', b'{"text": NaN}', b'[{"text": "a"}]', b'{"text": "a"} {}',
                               b'{"text": "\xed\xa0\x80"}', b'{"text": "\xc0\xaf"}', b'{"text": "a\\x"}', b""])
        lines.append(line)
    (tmp_path / "r.jsonl").write_bytes(b"\n".join(lines) + b"\n")

    def reference(line):
        try:
            obj = json.loads(line.decode("utf-8"), parse_constant=lambda c: 1 / 0)
            return obj["text"].encode("utf-8") if isinstance(obj, dict) and isinstance(obj.get("text"), str) else None
        except (ValueError, UnicodeError, ZeroDivisionError, RecursionError):
            return None

    want = [(i + 1, t) for i, t in enumerate(map(reference, lines)) if t is not None]
    r = prepare(cli, "--input", tmp_path / "r.jsonl", "--out", tmp_path / "ds", "--skip-bad-lines", "--threads", 2)
    assert r.returncode == 0, r.stderr
    assert f"skipped {len(lines) - len(want)} bad lines" in r.stdout
    ds = Dataset(tmp_path / "ds")
    assert ds.n_docs == len(want)
    for d, (line_no, t) in enumerate(want):
        assert bytes(ds.read(d, 0, ds.doc_length(d)).astype(np.uint8)) == t, f"line {line_no}"
