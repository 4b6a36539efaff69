"""bytescale.torch attention: the blockwise kernel, varlen packs, the online-softmax merge, and ring
attention on 2, 3 and 4 processes (gloo, CPU) against full attention of the same rows on one process,
forward and backward: GQA, several segments per ring (packed rings), uneven chunks, members with no
rows. fp32 agrees at rounding level, float64 to 1e-10. The chunk layout equals the C library's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale  # noqa: E402
import bytescale.torch as bt  # noqa: E402
from bytescale.torch import attention, launch  # noqa: E402
from bytescale.torch.attention import reference_attention  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def rel(a, b):
    scale = b.abs().max()
    return float((a - b).abs().max() / scale) if scale > 0 else float(a.abs().max())


def grads_of(fn, q, k, v, dout):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


# ---- one process ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("H,G", [(4, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("tiles", [(512, 1024), (7, 5)])
def test_varlen_matches_dense(dtype, H, G, tiles, monkeypatch):
    monkeypatch.setattr(attention, "Q_TILE", tiles[0])
    monkeypatch.setattr(attention, "K_TILE", tiles[1])
    g = torch.Generator().manual_seed(H * 10 + G)
    lens = [1, 17, 40, 3, 29]
    T, hd = sum(lens), 8
    q = torch.randn(T, H, hd, generator=g, dtype=dtype)
    k = torch.randn(T, G, hd, generator=g, dtype=dtype)
    v = torch.randn(T, G, hd, generator=g, dtype=dtype)
    dout = torch.randn(T, H, hd, generator=g, dtype=dtype)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]))
    pos = torch.cat([torch.arange(n) for n in lens])
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    got = grads_of(lambda a, b, c: bt.varlen_attention(a, b, c, cu), q, k, v, dout)
    ref = grads_of(lambda a, b, c: reference_attention(a, b, c, pos, seg, pos, seg), q, k, v, dout)
    for x, y in zip(got, ref):
        assert rel(x, y) < TOL[dtype]


def test_merge_of_key_halves_is_full_attention():
    """Attention over two disjoint key sets, merged by log-sum-exp, equals attention over both."""
    g = torch.Generator().manual_seed(1)
    T, H, G, hd = 50, 4, 2, 8
    q = torch.randn(T, H, hd, generator=g, dtype=torch.float64)
    k = torch.randn(T, G, hd, generator=g, dtype=torch.float64)
    v = torch.randn(T, G, hd, generator=g, dtype=torch.float64)
    pos, seg = torch.arange(T), torch.zeros(T, dtype=torch.int64)
    rows = bt.Rows(pos, seg)
    full, lse_full = bt.block_forward(q, k, v, rows, rows)
    a, b = torch.arange(0, T, 2), torch.arange(1, T, 2)
    oa, la = bt.block_forward(q, k[a], v[a], rows, bt.Rows(pos[a], seg[a]))
    ob, lb = bt.block_forward(q, k[b], v[b], rows, bt.Rows(pos[b], seg[b]))
    assert torch.isinf(lb[0]).all()  # row 0 sees no key of the odd half: merge must take the other side
    out, lse = bt.merge(oa, la, ob, lb)
    assert rel(out, full) < 1e-12 and rel(lse, lse_full) < 1e-12


def test_long_pack_is_blockwise(monkeypatch):
    """A pack never materialises a T x T score matrix: with tiles of 64 x 128 the largest tensor
    the kernel makes for 4,096 rows is a tile, not 4,096^2 (checked through the scores' shapes)."""
    monkeypatch.setattr(attention, "Q_TILE", 64)
    monkeypatch.setattr(attention, "K_TILE", 128)
    seen = []
    real_bmm = torch.bmm

    def spy(a, b):
        out = real_bmm(a, b)
        seen.append(out.numel())
        return out

    monkeypatch.setattr(torch, "bmm", spy)
    T, H, G, hd = 4096, 2, 1, 8
    q, k, v = torch.randn(T, H, hd), torch.randn(T, G, hd), torch.randn(T, G, hd)
    bt.varlen_attention(q, k, v, torch.tensor([0, 1000, T]))
    assert max(seen) <= G * H * 64 * 128


# ---- the chunk layout ---------------------------------------------------------------------------------

def test_chunk_layout_matches_the_library():
    """StepPlan's member rows (Python) are the C library's chunk ranges (bs_plan_chunks) for random
    batches and every policy."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        lengths = rng.integers(1, 300, int(rng.integers(3, 30)))
        for policy in ("static", "naive", "balance", "elastic"):
            ranks = int(rng.integers(2, 9))
            cap = max(64, int(np.ceil(lengths.max() / ranks)) + 1)
            p = bytescale.plan(lengths, ranks=ranks, capacity=cap, policy=policy, model="tiny", hardware="cpu", tp=1,
                               offload=False)
            docs = list(range(len(lengths)))
            sp = bt.StepPlan.from_plan(p, bt.Batch(docs, [0] * len(docs), lengths.tolist()), 0)
            for r in range(ranks):
                c = p.chunk_arrays(r)
                want = sorted(zip(c.item.tolist(), c.seq.tolist(), c.start.tolist(), c.len.tolist()))
                got = []
                for k in sp.schedule(r):
                    rs, segs = sp.items[k]
                    m = rs.index(r)
                    for (q, start, n) in segs:
                        for s, cnt in bt.member_pieces(n, len(rs), m):
                            if cnt:
                                got.append((k, q, start + s, cnt))
                merged = []  # the library gives touching chunks (member D-1) as one range
                for x in sorted(got):
                    if merged and merged[-1][:2] == x[:2] and merged[-1][2] + merged[-1][3] == x[2]:
                        merged[-1] = (x[0], x[1], merged[-1][2], merged[-1][3] + x[3])
                    else:
                        merged.append(x)
                assert merged == want, (trial, policy, r)


# ---- rings on D processes -------------------------------------------------------------------------------

CASES = [
    # (segment lengths of the ring's item, H, G, head_dim)
    ([37], 4, 2, 8),              # one sequence, uneven chunks
    ([64], 4, 4, 16),             # even chunks, no GQA
    ([5, 100, 1, 23], 4, 2, 8),   # a packed ring: several segments, some shorter than 2D (empty chunks)
    ([3], 6, 1, 4),               # 3 tokens: on D >= 2 some members hold nothing at all
    ([200, 7], 2, 1, 8),          # GQA 2:1, a long and a short segment
    ([1], 4, 2, 8),               # one token: every member but the first holds nothing
    ([2, 1], 4, 2, 8),            # a packed ring of tiny segments: empty members on D >= 3
]


def ring_worker(rank, world):
    """Every case, in fp64 and fp32, with the default tiles and with tiles of a few rows (many tiles,
    skipped and masked ones), on a ring of all `world` ranks in a shuffled order: this member's
    outputs and gradients against full attention of the whole item computed locally."""
    errs = []
    for dtype in (torch.float64, torch.float32):
        for tiles in ((512, 1024), (7, 5)):
            attention.Q_TILE, attention.K_TILE = tiles
            for ci, (segs, H, G, hd) in enumerate(CASES):
                g = torch.Generator().manual_seed(ci)
                T = sum(segs)
                q = torch.randn(T, H, hd, generator=g, dtype=dtype)
                k = torch.randn(T, G, hd, generator=g, dtype=dtype)
                v = torch.randn(T, G, hd, generator=g, dtype=dtype)
                dout = torch.randn(T, H, hd, generator=g, dtype=dtype)
                order = torch.randperm(world, generator=g).tolist()  # the ring's order is the plan's
                plan = bt.StepPlan(n_ranks=world, seq_doc=list(range(len(segs))), seq_start=[0] * len(segs),
                                   seq_len=list(segs),
                                   items=[(tuple(order), tuple((i, 0, n) for i, n in enumerate(segs)))], labelled=0)
                members = [bt.Rows(*map(torch.from_numpy, plan.member_rows(0, m))) for m in range(world)]
                me = order.index(rank)
                # this member's rows in the item's row order (segment by segment, by position)
                base = np.concatenate([[0], np.cumsum(segs)])
                pos, seg = plan.member_rows(0, me)
                idx = torch.from_numpy(base[seg] + pos)
                ring = bt.Ring(order, me, members)
                got = grads_of(lambda a, b, c: bt.ring_attention(a, b, c, ring), q[idx], k[idx], v[idx], dout[idx])
                gpos = torch.cat([torch.arange(n) for n in segs])
                gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
                ref = grads_of(lambda a, b, c: reference_attention(a, b, c, gpos, gseg, gpos, gseg), q, k, v, dout)
                # relative to the whole item's largest value (absolute where it is 0: one token's dq, dk)
                e = [float((x - y[idx]).abs().max() / (y.abs().max() if y.abs().max() > 0 else 1.0))
                     if len(idx) else 0.0 for x, y in zip(got, ref)]
                errs.append((dtype, tiles, ci, len(idx), e))
    return errs


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_matches_full(world):
    results = launch.spawn(ring_worker, world)
    empty, worst = 0, {torch.float32: 0.0, torch.float64: 0.0}
    for rank, errs in enumerate(results):
        for dtype, tiles, ci, n, e in errs:
            empty += n == 0
            worst[dtype] = max(worst[dtype], max(e))
            assert max(e) < TOL[dtype], (world, dtype, tiles, rank, CASES[ci], e)
    assert empty > 0, "no member without rows: the cases should include one"
    print(f"\nD = {world}: largest relative error (out, dq, dk, dv) fp64 {worst[torch.float64]:.1e}, "
          f"fp32 {worst[torch.float32]:.1e}")
