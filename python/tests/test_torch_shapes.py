"""q, k, v of the wrong size get one ValueError naming the tensor, its shape and the shape expected,
at every attention entry point (a pack, a ring, an a2a and a hybrid item, hdp_attention in both
layouts), before any message: these run in one process with no process group, so a message posted
would fail with another error. The micro-batches are the ones `microbatches()` makes from a plan."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch.shapes import ShapeError, check_qkv  # noqa: E402

H, G, HD = 4, 2, 16


def source():
    return bt.FunctionSource(lambda doc, start, n: (np.arange(start, start + n) * 7 + doc) % 256,
                             lambda doc: 1000)


def plan():
    """Rank 0 of 4: a pack of two sequences (50 + 30 rows), a ring of ranks 0-1 over a 162-token
    sequence (81 rows each), an a2a item of ranks 0-1 (81 rows each), a hybrid of 2 x 2 (41 rows)."""
    items = [((0,), ((0, 0, 50), (1, 0, 30))), ((0, 1), ((2, 0, 162),)), ((0, 1), ((3, 0, 162),)),
             ((0, 1, 2, 3), ((4, 0, 164),))]
    return bt.StepPlan(n_ranks=4, seq_doc=[0, 1, 2, 3, 4], seq_start=[0] * 5, seq_len=[50, 30, 162, 162, 164],
                       items=items, labelled=568, ulysses=[0, 0, 2, 2])


@pytest.fixture(scope="module")
def mbs():
    out = bt.microbatches(plan(), 0, source(), check=False)  # one process looks at rank 0's share of 4
    assert [len(m.tokens) for m in out] == [80, 81, 81, 41]
    assert out[1].ring is not None and out[2].ulysses is not None and out[3].ulysses.r == 2
    return out


def qkv(T, h=H, g=G, hd=HD, dtype=torch.float64):
    gen = torch.Generator().manual_seed(T)
    return (torch.randn(T, h, hd, generator=gen, dtype=dtype), torch.randn(T, g, hd, generator=gen, dtype=dtype),
            torch.randn(T, g, hd, generator=gen, dtype=dtype))


def attend(mb, q, k, v, layout="thd"):
    with bt.microbatch_context(mb):
        return bt.hdp_attention(q, k, v, layout=layout)


def expect(fn, pattern):
    with pytest.raises(ValueError, match=re.escape(pattern)) as e:
        fn()
    assert isinstance(e.value, ShapeError)
    return str(e.value)


def test_pack_names_the_tensor_and_both_sizes(mbs):
    pack = mbs[0]
    q, k, v = qkv(80)
    out = attend(pack, q, k, v)  # the right shapes run (positive control)
    assert out.shape == (80, H, HD)
    expect(lambda: attend(pack, q, k[:79], v),
           "attention of a pack: k has shape (79, 2, 16), expected (80, 2, 16): 80 rows, the micro-batch's rows")
    expect(lambda: attend(pack, q, k, v[:79]), "attention of a pack: v has shape (79, 2, 16), expected (80, 2, 16)")
    expect(lambda: attend(pack, qkv(81)[0], k, v), "attention of a pack: q has shape (81, 4, 16), expected (80, 4, 16)")
    expect(lambda: attend(pack, q, *qkv(80, g=3)[1:]),
           "k has shape (80, 3, 16), expected (80, G, 16): its 3 K/V heads must divide q's 4 query heads")
    expect(lambda: attend(pack, q, k, v[:, :, :8]), "v has shape (80, 2, 8), expected (80, 2, 16): head_dim 16")
    expect(lambda: attend(pack, q, k, v[:, :1]), "v has shape (80, 1, 16), expected (80, 2, 16): k's shape")
    expect(lambda: attend(pack, q, k.float(), v), "k is torch.float32 on cpu, q is torch.float64 on cpu")
    expect(lambda: attend(pack, q, k[0], v), "k has shape (2, 16), expected 3 dimensions")
    # varlen attention: the rows cu_seqlens gives
    cu = torch.tensor([0, 50, 80])
    expect(lambda: bt.varlen_attention(q, k[:79], v, cu),
           "varlen attention: k has shape (79, 2, 16), expected (80, 2, 16): 80 rows, as cu_seqlens ends at 80")


def test_pack_bhsd_layout_says_what_was_passed(mbs):
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in qkv(80))  # (1, heads, T, hd)
    assert attend(mbs[0], q, k, v, "bhsd").shape == (1, H, 80, HD)
    msg = expect(lambda: attend(mbs[0], q, k[:, :, :79], v, "bhsd"),
                 "attention of a pack: k has shape (79, 2, 16), expected (80, 2, 16)")
    assert "layout bhsd" in msg and "k (1, 2, 79, 16)" in msg, msg
    expect(lambda: attend(mbs[0], q.expand(2, -1, -1, -1), k, v, "bhsd"), "layout bhsd: q (1, H, T, hd)")


def test_ring_names_k_not_q(mbs):
    """The issue's case: k one row short on a ring used to read '81 local rows, the plan gives this
    rank 81' (q's count twice)."""
    ring = mbs[1]
    q, k, v = qkv(81)
    msg = expect(lambda: attend(ring, q, k[:80], v),
                 "ring attention: k has shape (80, 2, 16), expected (81, 2, 16): 81 rows, the rows the plan "
                 "gives this rank (member 0 of ring [0, 1]) (q (81, 4, 16))")
    assert "81 local rows" not in msg
    expect(lambda: attend(ring, q[:80], k[:80], v[:80]), "ring attention: q has shape (80, 4, 16), expected (81, 4, 16)")
    expect(lambda: attend(ring, q, k, v[:, :, :15]), "ring attention: v has shape (81, 2, 15), expected (81, 2, 16)")
    expect(lambda: bt.ring_attention(q, k[:, :1].expand(81, 3, 16), v, ring.ring),
           "ring attention: k has shape (81, 3, 16), expected (81, G, 16): its 3 K/V heads must divide")


def test_a2a_and_hybrid_name_the_tensor(mbs):
    a2a, hybrid = mbs[2], mbs[3]
    q, k, v = qkv(81)
    expect(lambda: attend(a2a, q, k, v[:80]),
           "a2a attention: v has shape (80, 2, 16), expected (81, 2, 16): 81 rows, the rows the plan gives this "
           "rank (member 0 of item [0, 1])")
    expect(lambda: attend(a2a, *qkv(81, h=1, g=1)),
           "a2a attention: q has shape (81, 1, 16), 1 heads: the item's Ulysses group of 2 members needs at least 2")
    q, k, v = qkv(41)
    expect(lambda: attend(hybrid, q, k[:40], v), "hybrid attention: k has shape (40, 2, 16), expected (41, 2, 16)")
    expect(lambda: bt.ulysses_attention(q[:, :, :8], k, v, hybrid.ulysses),
           "hybrid attention: k has shape (41, 2, 16), expected (41, 2, 8): head_dim 8")


def test_check_accepts_every_valid_shape():
    """GQA 1:1, 2:1, 4:1, MQA, empty members (0 rows), fp32 and fp64: no error."""
    for h, g in ((4, 4), (4, 2), (8, 2), (6, 1)):
        for T in (0, 1, 33):
            for dtype in (torch.float32, torch.float64):
                check_qkv("t", *qkv(T, h, g, 8, dtype), T, "rows")
