"""bytescale.torch.loader.HDPLoader (docs/torch-data.md), against computations of its own: every
rank's micro-batches gathered hold each planned sequence's tokens exactly once, equal to the
documents read directly, with labels the document's next token (-1 at its end); the global batches
are the seeded document stream cut by the budget; a tiny model trained from the loader on 2
processes (its thread's collectives beside the training's) gives the losses of one process trained
from a one-process loader; a state taken after step 3 of a 2-process job, loaded in a 3-process job,
gives the uninterrupted run's batches; the prefetch is made before it is asked for (the loader's own
record); errors met in the thread reach every rank with their message; the three inputs (a torch
Dataset, Hugging Face datasets from JSONL and parquet, a prepared dataset) and bad ones.

Three spawned jobs (2 and 3 processes, and 4 as tp 2 x hdp 2) carry the multi-process checks; the rest
runs in this process.
"""

import json
import os
import subprocess
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402
from bytescale.torch.loader import DocumentError, HDPLoader, LoaderError  # noqa: E402

VOCAB = 256
SEED = 11
STEPS = 6  # 6 x 600 tokens: more than the corpus's ~3300, so the run crosses an epoch
CUT = 3  # the state is taken after this many steps
PREFETCH = 2
LOADER = dict(tokens=600, capacity=160, context=200, seed=SEED, prefetch=PREFETCH, steps=STEPS)  # 200 > 160: rings


def corpus(n=16, seed=4):
    """Documents of 0..420 tokens (some empty), the same in every process."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 420, n)
    lengths[::7] = 0
    return [torch.from_numpy(rng.integers(0, VOCAB, int(k))) for k in lengths]


class Docs(torch.utils.data.Dataset):
    """A map-style dataset of 1-D token tensors; `fail_rank`: that rank's reads raise OSError."""

    def __init__(self, docs, fail_rank=None):
        self.docs, self.fail_rank = docs, fail_rank

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        if self.fail_rank is not None and dist.is_initialized() and dist.get_rank() == self.fail_rank:
            raise OSError(f"disk gone reading item {i}")
        return self.docs[i]


def shares(step):
    """This rank's micro-batches of a LoaderStep as arrays (item, tokens, targets, pos, seg), each with
    its position_ids checked against pos."""
    out = []
    for mb in step:
        assert tuple(mb.position_ids.shape) == (1, mb.T) and torch.equal(mb.position_ids[0], mb.pos)
        out.append((mb.item, *(t.numpy().copy() for t in (mb.tokens, mb.targets, mb.pos, mb.seg))))
    return out


def until_full(loader, want):
    """A slow step: it ends once the loader's thread has made the next `want` steps (a bound only for a
    broken loader); returns the steps made ahead then."""
    end = time.monotonic() + 120
    while loader.prefetched < want:
        if time.monotonic() > end:
            raise AssertionError(f"the loader made {loader.prefetched} of {want} steps ahead in 120 s")
        time.sleep(0.01)
    return loader.prefetched


def caught(fn):
    """(type name, message) of what fn raises."""
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return None, ""


def _errors(docs):
    """Errors met in the thread, as every rank sees them: a negative token (rank 0 meets it drawing),
    a token outside the vocabulary, a read that fails on rank 1 only, ranks at different steps; next()
    again raises the same."""
    bad = [d.clone() for d in docs]
    bad[1][3] = -5
    out = {}
    with HDPLoader(Docs(bad), **LOADER) as ld:
        out["negative"] = caught(lambda: [None for _ in ld])  # at the step that draws document 1
        out["negative_at"] = ld.step
        out["again"] = caught(lambda: next(ld))
    with HDPLoader(Docs(docs), vocab=100, **LOADER) as ld:
        out["vocab"] = caught(lambda: next(ld))
    with HDPLoader(Docs(docs, fail_rank=1), **LOADER) as ld:
        out["read"] = caught(lambda: next(ld))
    with HDPLoader(Docs(docs), **LOADER) as ld:  # the ranks load different states
        ld.load_state_dict(dict(ld.state_dict(), step=dist.get_rank()))
        out["steps"] = caught(lambda: next(ld))
    return out


def _two(rank, world):
    """The 2-process job: train from the loader (waiting, after each step, for the steps ahead), take
    the state after step CUT, resume it in this job, another seed, the errors."""
    docs = corpus()
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=1e-2, warmup=1, schedule_steps=10)
    out = {"plans": [], "shares": [], "losses": [], "full": []}
    loader = HDPLoader(Docs(docs), ring_stats=trainer.ring_stats, **LOADER)
    for step in loader:
        out["plans"].append(step.plan)
        out["shares"].append(shares(step))
        out["losses"].append(trainer.step(step.plan, step.microbatches).loss)
        if step.step + 1 == CUT:
            out["state"] = loader.state_dict()
        if step.step + 1 < STEPS:
            out["full"].append(until_full(loader, min(PREFETCH, STEPS - step.step - 1)))
    out["stats"], out["summary"] = list(loader.stats), loader.summary()
    out["end_state"] = loader.state_dict()
    loader.close()
    again = HDPLoader(Docs(docs), **LOADER)
    again.load_state_dict(out["state"])
    out["reloaded_first"] = next(again).plan.batch
    again.load_state_dict(out["state"])  # mid-run: the thread starts again from the state
    out["resumed"] = [s.plan.batch for s in again]
    again.close()
    with HDPLoader(Docs(docs), **dict(LOADER, seed=SEED + 1)) as other:
        out["other_seed"] = next(other).plan.batch
    out["errors"] = _errors(docs)
    return out


def _three(rank, world, state):
    """The 3-process job: load the 2-process job's state, run to the end."""
    loader = HDPLoader(Docs(corpus()), **LOADER)
    loader.load_state_dict(state)
    loader.start()  # reading ahead before the first next()
    out = [(s.plan, shares(s)) for s in loader]
    loader.close()
    return out


def _layout(rank, world):
    """4 processes as tp 2 x hdp 2 (a Layout): each process's share of each step."""
    layout = bt.Layout(tp=2)
    with HDPLoader(Docs(corpus()), layout=layout, **dict(LOADER, steps=3)) as loader:
        return layout.hdp_rank, [(s.plan, shares(s)) for s in loader]


@pytest.fixture(scope="module")
def two():
    return launch.spawn(_two, 2, timeout_s=240)


@pytest.fixture(scope="module")
def three(two):
    return launch.spawn(_three, 3, args=(two[0]["state"],), timeout_s=240)


def check_step(plan, per_rank, docs):
    """Every rank's micro-batches of `plan` gathered: each row of each planned sequence held once, its
    token and label those of the document read directly; the planned sequences are the batch's."""
    docs = [np.asarray(d, np.int64) for d in docs]
    seen = [np.zeros(n, np.int64) for n in plan.seq_len]
    tok = [np.full(n, -2, np.int64) for n in plan.seq_len]
    tgt = [np.full(n, -2, np.int64) for n in plan.seq_len]
    for rank_shares in per_rank:
        for item, tokens, targets, pos, seg in rank_shares:
            segs = plan.items[item][1]
            for t, y, p, s in zip(tokens, targets, pos, seg):
                q = segs[s][0]
                seen[q][p] += 1
                tok[q][p], tgt[q][p] = t, y
    for q, n in enumerate(plan.seq_len):
        assert (seen[q] == 1).all(), f"sequence {q}: rows held {sorted(set(seen[q].tolist()))} times"
        doc, a = docs[plan.seq_doc[q]], plan.seq_start[q]
        np.testing.assert_array_equal(tok[q], doc[a:a + n])
        nxt = np.append(doc, -1)[a + 1:a + n + 1]  # the next token of the document, -1 past its end
        np.testing.assert_array_equal(tgt[q], nxt)
    b = plan.batch
    assert sorted(zip(plan.seq_doc, plan.seq_start, plan.seq_len)) == sorted(zip(b.docs, b.starts, b.lengths))


def stream(lengths, seed, n):
    """The first n (document, token) pairs of the seeded order: epoch e's documents in
    numpy.random.default_rng([seed, e]).permutation order, each whole."""
    out, e = [], 0
    while len(out) < n:
        for d in np.random.default_rng([seed, e]).permutation(len(lengths)):
            out += [(int(d), i) for i in range(int(lengths[d]))]
        e += 1
    return out[:n]


def flat(batches):
    return [(d, s + i) for b in batches for d, s, n in zip(b.docs, b.starts, b.lengths) for i in range(n)]


def same_batch(a, b):
    return list(a.docs) == list(b.docs) and list(a.starts) == list(b.starts) and list(a.lengths) == list(b.lengths)


def test_tokens_labels_and_batches(two):
    """Every step's micro-batches of both ranks gathered equal the documents; the batches are the
    seeded stream cut every 600 tokens, no piece over the context."""
    docs = corpus()
    r0, r1 = two
    for k in range(STEPS):
        assert bt.plan_fingerprint(r0["plans"][k]) == bt.plan_fingerprint(r1["plans"][k])
        check_step(r0["plans"][k], [r0["shares"][k], r1["shares"][k]], docs)
        b = r0["plans"][k].batch
        assert sum(b.lengths) == LOADER["tokens"] and max(b.lengths) <= LOADER["context"]
    assert sum(p.n_rings for p in r0["plans"]) > 0  # sequences over the capacity ran as rings
    batches = [p.batch for p in r0["plans"]]
    assert flat(batches) == stream([len(d) for d in docs], SEED, STEPS * LOADER["tokens"])
    assert r0["end_state"] == r1["end_state"] and r0["end_state"]["step"] == STEPS


def test_losses_match_one_process(two):
    """The 2-process losses (rings, the thread's collectives beside the training's) are those of one
    process trained from a loader of one rank (other plans, the same batches), float64."""
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    trainer = bt.HDPTrainer(model, lr=1e-2, warmup=1, schedule_steps=10)
    with HDPLoader(Docs(corpus()), **dict(LOADER, capacity=LOADER["context"])) as one:
        ref = [trainer.step(s.plan, s.microbatches).loss for s in one]
    np.testing.assert_allclose(two[0]["losses"], ref, rtol=1e-10)
    assert two[0]["losses"] == two[1]["losses"]


def test_resume_on_three_processes(two, three):
    """The state after step 3 of the 2-process job, loaded in a 3-process job, gives steps 3..5 of the
    uninterrupted run (and its micro-batches the documents); loaded again mid-run, the same."""
    docs = corpus()
    r0 = two[0]
    assert r0["state"]["step"] == CUT
    assert len(three[0]) == STEPS - CUT
    for k, (plan, _) in enumerate(three[0]):
        assert plan.step == CUT + k and plan.n_ranks == 3
        assert same_batch(plan.batch, r0["plans"][CUT + k].batch)
        check_step(plan, [three[r][k][1] for r in range(3)], docs)
    assert same_batch(r0["reloaded_first"], r0["plans"][CUT].batch)
    assert len(r0["resumed"]) == STEPS - CUT
    assert all(same_batch(a, p.batch) for a, p in zip(r0["resumed"], r0["plans"][CUT:]))


def test_layout_tp2_hdp2():
    """With a Layout the plan is for its HDP ranks, both tp ranks of an HDP rank hold the same
    micro-batches, and the HDP ranks' shares gathered equal the documents; the batches are the
    2-process job's."""
    res = launch.spawn(_layout, 4, timeout_s=240)
    docs = corpus()
    assert [h for h, _ in res] == [0, 0, 1, 1]  # process r: tp rank r % 2, HDP rank r // 2
    for (_, a), (_, b) in ((res[0], res[1]), (res[2], res[3])):
        for (pa, sa), (pb, sb) in zip(a, b):
            assert bt.plan_fingerprint(pa) == bt.plan_fingerprint(pb)
            assert len(sa) == len(sb)
            for u, v in zip(sa, sb):
                assert u[0] == v[0] and all(np.array_equal(x, y) for x, y in zip(u[1:], v[1:]))
    for k, (plan, _) in enumerate(res[0][1]):
        assert plan.n_ranks == 2
        check_step(plan, [res[0][1][k][1], res[2][1][k][1]], docs)
    assert flat([p.batch for p, _ in res[0][1]]) == stream([len(d) for d in docs], SEED, 3 * LOADER["tokens"])


def test_seeded(two):
    """Both ranks drew the same; another seed draws another first batch."""
    assert all(same_batch(a.batch, b.batch) for a, b in zip(two[0]["plans"], two[1]["plans"]))
    assert not same_batch(two[0]["other_seed"], two[0]["plans"][0].batch)


def test_prefetch_made_ahead(two):
    """After each slow step the thread had made the next steps (never more than `prefetch` ahead), and
    next() found each of them made (the loader's record)."""
    for r in two:
        assert r["full"] == [min(PREFETCH, STEPS - k - 1) for k in range(STEPS - 1)]
        stats = r["stats"]
        assert [s.step for s in stats] == list(range(STEPS))
        assert all(s.ready for s in stats[1:]), [s.ready for s in stats]
        assert all(s.read_s > 0 for s in stats)
        summary = r["summary"]
        assert summary["steps"] == STEPS and summary["ready"] == 1.0
        assert summary["wait_max_s"] == max(s.wait_s for s in stats[1:]) and summary["first_wait_s"] == stats[0].wait_s


def test_errors_reach_every_rank(two):
    for r in two:
        e = r["errors"]
        assert e["negative"][0] == "PlanError" and "document 1: token -5 at offset 3" in e["negative"][1], e
        assert e["again"] == e["negative"] and e["negative_at"] == two[0]["errors"]["negative_at"]
        assert e["vocab"][0] == "PlanError" and "outside the vocabulary of 100" in e["vocab"][1], e
        assert e["read"][0] == "LoaderError", e
        assert "rank 1 could not read its tokens: OSError: disk gone reading item" in e["read"][1]
        assert e["steps"] == ("LoaderError", "bytescale.torch.loader: the ranks' loaders are at different steps "
                              "(rank 0: 0, rank 1: 1; rank 0 planned step 0): load the same state on every rank and "
                              "consume the same steps")


# -- the inputs, in this process ------------------------------------------------------------------------


def one_process(data, docs, **kw):
    """Three steps of a one-rank loader over `data`, each checked against `docs` (the documents as written)."""
    args = dict(LOADER, capacity=LOADER["context"], steps=3, **kw)
    with HDPLoader(data, **args) as ld:
        plans = [(s.plan, shares(s)) for s in ld]
    assert len(plans) == 3
    for plan, sh in plans:
        check_step(plan, [sh], docs)
    assert flat([p.batch for p, _ in plans]) == stream([len(d) for d in docs], SEED, 3 * LOADER["tokens"])


@pytest.fixture(scope="module")
def hf():
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return pytest.importorskip("datasets")


def test_torch_dataset_and_dicts():
    docs = corpus(seed=7)
    one_process(Docs(docs), docs)
    one_process([{"ids": d, "other": 1} for d in docs], docs, column="ids")  # a list is a map-style dataset


def test_hf_jsonl_and_parquet(hf, tmp_path):
    """A token-id column from JSONL; a text column from parquet with a tokenizer (UTF-8 bytes)."""
    docs = [d.tolist() for d in corpus(seed=8)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"input_ids": d, "n": len(d)}) + "\n" for d in docs))
    ds = hf.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    one_process(ds, docs)
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(9)
    texts = ["".join(chr(int(c)) for c in rng.integers(32, 1000, int(k))) for k in rng.integers(0, 300, 14)]
    pd.DataFrame({"text": texts}).to_parquet(tmp_path / "docs.parquet")
    ds = hf.load_dataset("parquet", data_files=str(tmp_path / "docs.parquet"), split="train",
                         cache_dir=str(tmp_path / "hf"))
    encode = lambda s: {"input_ids": list(s.encode("utf-8"))}  # noqa: E731 (a mapping, as HF tokenizers give)
    one_process(ds, [list(t.encode("utf-8")) for t in texts], tokenizer=encode, vocab=256)


def test_prepared_dataset(cli, tmp_path):
    """A dataset made by `bytescale prepare` from text files (byte tokens: a document is its file's bytes)."""
    src = tmp_path / "txt"
    src.mkdir()
    rng = np.random.default_rng(10)
    files = []
    for i, k in enumerate(rng.integers(0, 500, 12)):
        data = bytes(rng.integers(32, 127, int(k)).astype(np.uint8)) if i % 5 else b""
        (src / f"f{i:02d}.txt").write_bytes(data)
        files.append(data)
    subprocess.run([cli, "prepare", "--input", str(src), "--out", str(tmp_path / "ds")], check=True,
                   capture_output=True)
    ds = bt.Dataset(tmp_path / "ds")
    assert ds.n_docs == len(files)
    one_process(ds, [list(f) for f in files])


def test_bad_inputs(hf, tmp_path):
    """Bad input is refused with a message naming it: at once where the dataset shows it, else by next()."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [1, 2, 3], "text": "abc", "f": [1.5, 2.0]}) + "\n"
                            for _ in range(4)))
    ds = hf.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    make = lambda data, **kw: HDPLoader(data, **dict(LOADER, capacity=200, **kw))  # noqa: E731
    assert caught(lambda: make(ds, column="ids")) == (
        "DocumentError", "the Hugging Face dataset: no column 'ids' (its columns: ['input_ids', 'text', 'f']): "
        "name the token column with column=; a text column needs tokenizer=")
    assert "holds string, not lists of token ids" in caught(lambda: make(ds, column="text"))[1]
    assert "column 'f' holds lists of float64: token ids are integers" in caught(lambda: make(ds, column="f"))[1]
    assert caught(lambda: make(hf.DatasetDict({"train": ds})))[0] == "TypeError"
    assert caught(lambda: make([])) == ("DocumentError", "the dataset (list): an empty dataset (no documents)")
    assert "tokens=0: an integer >= 1" in caught(lambda: make(Docs(corpus()), tokens=0))[1]

    def first(data, **kw):
        with make(data, **kw) as ld:
            return caught(lambda: next(ld))

    kind, msg = first(Docs([torch.zeros(2, 3, dtype=torch.long)]))
    assert kind == "PlanError" and "document 0: shape (2, 3): a document is a 1-D sequence of token ids" in msg
    assert "document 0: a tensor of torch.float32: token ids are integers" in first(Docs([torch.ones(4)]))[1]
    assert "every one of the 2 documents is empty" in first(Docs([torch.zeros(0, dtype=torch.long)] * 2))[1]
    assert "token 9 at offset 1 is outside the vocabulary of 5" in first(Docs([torch.tensor([1, 9])]), vocab=5)[1]
    with make(Docs(corpus())) as ld:
        state = ld.state_dict()
    with make(Docs(corpus()), seed=SEED + 1) as ld:
        kind, msg = caught(lambda: ld.load_state_dict(state))
    assert kind == "ValueError" and f"seed {SEED} (this loader: {SEED + 1})" in msg
    assert issubclass(LoaderError, bt.PlanError) and issubclass(DocumentError, ValueError)
