"""bytescale.torch on GPUs, checked without one (docs/torch.md, "On GPUs"):

- every tensor the kernels and the model make follows the inputs' device and dtype: they run on the
  'meta' device under a dispatch mode that records every operation, with the default dtype set
  away from the inputs' (a tensor made without device= or dtype= shows up as CPU or default dtype);
- the fused-kernel dispatch: here it picks the blockwise kernel; with a stand-in flash_attn module
  it picks flash_attn_varlen_func, calls it with the pack's cu_seqlens, causal and the softmax scale,
  and uses its log-sum-exp; the block plans of ring and Ulysses layouts give full attention;
- the ring's CUDA stream path (side stream, events) run on gloo with stand-in streams: same results
  as full attention, and the compute stream waits for a received block only after computing the
  block in hand.
"""

import math
import queue
import sys
import threading
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bytescale.torch import attention, fused, launch, ring as ringmod, ulysses as ulymod  # noqa: E402
from bytescale.torch.attention import reference_attention  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402


def rel(a, b):
    scale = b.abs().max()
    return float((a - b).abs().max() / scale) if scale > 0 else float(a.abs().max())


# ---- device and dtype plumbing --------------------------------------------------------------------------

class Recorder(TorchDispatchMode):
    """Every operation's tensor inputs and outputs: (op, [(device, dtype, shape)] in, [...] out)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), [(t.device.type, t.dtype, t.dim()) for t in ins],
                         [(t.device.type, t.dtype, t.dim()) for t in outs]))
        return out


def check_follows(rec, allowed):
    """Every floating or boolean tensor an operation makes is on 'meta' with a dtype in `allowed`
    (bool aside), and no operation mixes a meta tensor with a CPU one (0-dim scalars aside). Integer
    CPU tensors are the rows' positions and segments, which the tile planning keeps on the host."""
    assert rec.ops, "nothing recorded"
    for op, ins, outs in rec.ops:
        for dev, dt, _ in outs:
            if dt.is_floating_point or dt == torch.bool:
                assert dev == "meta", f"{op} made a {dt} tensor on {dev}"
                assert dt == torch.bool or dt in allowed, f"{op} made {dt}, inputs want {allowed}"
        devs = {dev for dev, _, dim in ins + outs if dim > 0}
        assert "_to_copy" in op or not ({"meta", "cpu"} <= devs), f"{op} mixes meta and cpu tensors: {ins} -> {outs}"


@pytest.fixture
def default_dtype():
    old = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(old)


@pytest.mark.parametrize("dtype,default,allowed", [
    (torch.float64, torch.float32, (torch.float64,)),
    (torch.float16, torch.float64, (torch.float16, torch.float32)),   # statistics in fp32
    (torch.bfloat16, torch.float64, (torch.bfloat16, torch.float32)),
])
def test_attention_follows_device_and_dtype(dtype, default, allowed, default_dtype, monkeypatch):
    """varlen attention forward and backward, the blockwise kernel (small tiles: skipped, full and
    masked tiles) and the merge, on 'meta' tensors."""
    monkeypatch.setattr(attention, "Q_TILE", 8)
    monkeypatch.setattr(attention, "K_TILE", 16)
    default_dtype(default)
    lens = [5, 40, 19]
    T, H, G, hd = sum(lens), 4, 2, 8
    q = torch.empty(T, H, hd, dtype=dtype, device="meta", requires_grad=True)
    k = torch.empty(T, G, hd, dtype=dtype, device="meta", requires_grad=True)
    v = torch.empty(T, G, hd, dtype=dtype, device="meta", requires_grad=True)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64)
    rows = attention.cu_seqlens_rows(cu)
    with Recorder() as rec:
        out = bt.local_attention(q, k, v, rows, None)
        out.backward(torch.empty_like(out))
        o1, l1 = bt.block_forward(q.detach(), k.detach(), v.detach(), rows, rows)
        bt.merge(o1, l1, o1, l1)
    check_follows(rec, allowed)
    assert out.device.type == "meta" and out.dtype == dtype and q.grad.dtype == dtype and k.grad.dtype == dtype


def test_model_follows_device_and_dtype(default_dtype):
    """A whole forward and backward of the tiny model (RoPE tables included) on 'meta' in fp64 with
    fp32 the default: nothing goes to the host, nothing is made in the default dtype."""
    default_dtype(torch.float32)
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64, device="meta")
    lens = [30, 12]
    T = sum(lens)
    pos = torch.cat([torch.arange(n) for n in lens])
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    mb = types.SimpleNamespace(rows=bt.Rows(pos, seg), ring=None, ulysses=None)
    tokens = torch.zeros(T, dtype=torch.int64, device="meta")
    with Recorder() as rec:
        with bt.microbatch_context(mb):
            h = model.hidden(tokens, pos.to("meta"))
        h.sum().backward()
    check_follows(rec, (torch.float64,))
    assert model.param("layers.0.wq").grad.device.type == "meta"


class Mailbox:
    """An in-process stand-in for the default group's point-to-point messages, for members run as
    threads (threading.local names the calling member's rank): a send queues its tensor under
    (source, destination, tag), a receive's wait() takes the oldest and copies it in, so messages
    between two members with one tag match in order, as gloo's do."""

    def __init__(self):
        self.boxes, self.lock, self.local = {}, threading.Lock(), threading.local()

    def box(self, key):
        with self.lock:
            return self.boxes.setdefault(key, queue.Queue())

    def exchange(self, ops):
        me, works = self.local.rank, []
        for op in ops:
            if op.op is dist.isend:
                self.box((me, op.peer, op.tag)).put(op.tensor.clone())
            else:
                works.append(types.SimpleNamespace(wait=lambda b=self.box((op.peer, me, op.tag)), t=op.tensor:
                                                   t.copy_(b.get(timeout=120))))
        return works


def run_threads(D, fn):
    """fn(rank) on D threads at once; returns their results, re-raising the first failure."""
    res, errs = [None] * D, []

    def body(r):
        try:
            res[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below with its member
            errs.append((r, e))

    ts = [threading.Thread(target=body, args=(r,)) for r in range(D)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise AssertionError(f"member {errs[0][0]}") from errs[0][1]
    return res


@pytest.mark.parametrize("dtype,default,allowed", [
    (torch.float64, torch.float32, (torch.float64,)),
    (torch.bfloat16, torch.float64, (torch.bfloat16, torch.float32)),
])
@pytest.mark.parametrize("kind", ["ring", "a2a", "hybrid"])
def test_ring_and_ulysses_follow_device_and_dtype(kind, dtype, default, allowed, default_dtype, monkeypatch):
    """Ring attention (D = 3), an a2a item (D = 4) and a hybrid of 2 x 2 (a GQA group cut by the head
    split: H 6, G 3), forward and backward, their members as threads on 'meta' tensors with an
    in-process transport: every tensor they make (message buffers, partial sums, head shards) is on
    the inputs' device in their dtype or the statistics' fp32."""
    mail = Mailbox()
    monkeypatch.setattr(ringmod, "_exchange", mail.exchange)
    monkeypatch.setattr(ulymod, "_exchange", mail.exchange)
    # PyTorch 2's P2POp looks up the default process group when it is made, and these members have
    # none: the ops become plain records of what the transport above reads
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer, group=None, tag=0:
                        types.SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group, tag=tag))
    default_dtype(default)
    D = 3 if kind == "ring" else 4
    H, G, hd = (6, 3, 8) if kind != "ring" else (4, 2, 8)
    rows, _ = ring_layout([37, 6], D)

    def member(r):
        mail.local.rank = r
        n = rows[r].n
        q = torch.empty(n, H, hd, dtype=dtype, device="meta", requires_grad=True)
        k = torch.empty(n, G, hd, dtype=dtype, device="meta", requires_grad=True)
        v = torch.empty(n, G, hd, dtype=dtype, device="meta", requires_grad=True)
        with Recorder() as rec:
            if kind == "ring":
                out = bt.ring_attention(q, k, v, bt.Ring(list(range(D)), r, rows))
            else:
                grp = bt.Ulysses(list(range(D)), r, rows, D if kind == "a2a" else 2)
                out = bt.ulysses_attention(q, k, v, grp)
            out.backward(torch.empty_like(out))
        check_follows(rec, allowed)
        return out.device.type, q.grad.dtype, k.grad.device.type

    for got in run_threads(D, member):
        assert got == ("meta", dtype, "meta")


# ---- the fused-kernel dispatch --------------------------------------------------------------------------

def dense_varlen(q, k, v, cu_q, cu_k, causal, scale):
    """What a varlen kernel computes, densely: (out (n, H, hd), lse (H, n)) in fp64."""
    H, G = q.shape[1], k.shape[1]
    outs, lses = [], []
    for s in range(len(cu_q) - 1):
        qs = q[int(cu_q[s]):int(cu_q[s + 1])].double()
        ks = k[int(cu_k[s]):int(cu_k[s + 1])].double().repeat_interleave(H // G, dim=1)
        vs = v[int(cu_k[s]):int(cu_k[s + 1])].double().repeat_interleave(H // G, dim=1)
        sc = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            n, m = qs.shape[0], ks.shape[0]
            sc = sc.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1 + m - n), -math.inf)
        lses.append(torch.logsumexp(sc, -1))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(sc, -1), vs))
    return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1)


class FakeFlash:
    """flash_attn_varlen_func's signature and return, on any device, recording its calls.
    padded: return the log-sum-exp as flash-attn before 2.4 does, (sequences, H, max_seqlen_q)."""

    def __init__(self, padded=False, lse_shift=0.0):
        self.calls, self.returned, self.padded, self.shift = [], [], padded, lse_shift

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                 softmax_scale=None, causal=False, return_attn_probs=False):
        self.calls.append(dict(cu_q=cu_seqlens_q.clone(), cu_k=cu_seqlens_k.clone(), max_q=max_seqlen_q,
                               max_k=max_seqlen_k, dropout=dropout_p, scale=softmax_scale, causal=causal,
                               probs=return_attn_probs, n=q.shape[0]))
        out, lse = dense_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale)
        lse = lse + self.shift
        self.returned.append((out, lse.t()))
        if self.padded:
            lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
            pad = torch.full((len(lens), lse.shape[0], max_seqlen_q), 7.0, dtype=lse.dtype)  # junk past each sequence
            for s, n in enumerate(lens):
                pad[s, :, :n] = lse[:, int(cu_seqlens_q[s]):int(cu_seqlens_q[s]) + n]
            lse = pad
        return out, lse, None


def cpu_flash(fn):
    """FlashVarlen over `fn`, taking CPU fp32 / fp64 tensors (the real one takes CUDA fp16 / bf16)."""
    kern = fused.FlashVarlen(fn)
    kern.devices, kern.dtypes = ("cpu",), (torch.float32, torch.float64)
    return kern


def test_kernel_here():
    """Chosen once at import; on a machine without CUDA (this one), the blockwise kernel."""
    assert attention.KERNEL.name == fused.select_kernel().name
    if not torch.cuda.is_available():
        assert not attention.KERNEL.fused and attention.KERNEL.name.startswith("reference")


def test_selection(monkeypatch):
    fake = FakeFlash()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=fake))
    k = fused.select_kernel("auto")
    assert isinstance(k, fused.FlashVarlen) and k.fn is fake and k.fused
    assert k.name == "flash_attn.flash_attn_varlen_func"
    assert not fused.select_kernel("reference").fused
    monkeypatch.setenv("BYTESCALE_ATTN_KERNEL", "reference")
    assert not fused.select_kernel().fused
    monkeypatch.setenv("BYTESCALE_ATTN_KERNEL", "flash_attn")
    assert fused.select_kernel().fn is fake
    with pytest.raises(ValueError, match="BYTESCALE_ATTN_KERNEL"):
        fused.select_kernel("flash")
    # no flash-attn: torch's flash attention where the op exists, else the blockwise kernel
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import raises ImportError
    op = types.SimpleNamespace(default=types.SimpleNamespace(_schema="(Tensor query, ..., *, float? scale=None)"))
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention", op, raising=False)
    got = fused.select_kernel("auto")
    assert isinstance(got, fused.TorchFlash) and got.op is op
    op.default._schema = "(Tensor query, Tensor key, Tensor value, float dropout_p=0., bool is_causal=False)"
    assert not isinstance(fused.select_kernel("auto"), fused.TorchFlash)  # torch 2.0: no scale=
    monkeypatch.delattr(torch.ops.aten, "_scaled_dot_product_flash_attention")
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention"):
        assert not fused.select_kernel("auto").fused
    with pytest.raises(ImportError):
        fused.select_kernel("flash_attn")
    # no CUDA: the blockwise kernel whatever is importable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=fake))
    assert not fused.select_kernel("auto").fused


@pytest.mark.parametrize("padded", [False, True])
def test_pack_calls_flash_varlen(padded, monkeypatch):
    """A pack: one causal call with the documents' cu_seqlens (int32, on the tensors' device), the
    longest document, dropout 0, the softmax scale, return_attn_probs; the output and log-sum-exp
    are the fake's own; the backward (blockwise, from that log-sum-exp) gives dense attention's
    gradients."""
    fake = FakeFlash(padded=padded)
    monkeypatch.setattr(attention, "KERNEL", cpu_flash(fake))
    g = torch.Generator().manual_seed(5)
    lens = [1, 17, 40, 3, 29]
    T, H, G, hd = sum(lens), 4, 2, 8
    q, k, v, dout = (torch.randn(T, n, hd, generator=g, dtype=torch.float64, requires_grad=i < 3)
                     for i, n in enumerate((H, G, G, H)))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]))
    out = bt.varlen_attention(q, k, v, cu)
    assert len(fake.calls) == 1
    c = fake.calls[0]
    assert c["causal"] and c["probs"] and c["dropout"] == 0.0 and c["scale"] == pytest.approx(1 / math.sqrt(hd))
    assert c["cu_q"].dtype == torch.int32 and c["cu_q"].tolist() == cu.tolist() == c["cu_k"].tolist()
    assert c["max_q"] == c["max_k"] == 40 and c["n"] == T
    rows = attention.cu_seqlens_rows(cu)
    o, lse = bt.block_forward(q.detach(), k.detach(), v.detach(), rows, rows, scale=0.3)
    assert fake.calls[-1]["scale"] == 0.3
    assert torch.equal(o, fake.returned[-1][0]) and torch.equal(lse, fake.returned[-1][1])
    pos, seg = rows._cpu
    ref = reference_attention(q, k, v, pos, seg, pos, seg)
    assert rel(out, ref) < 1e-12
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for x, y in zip(got, want):
        assert rel(x, y) < 1e-12


def test_fused_lse_is_used(monkeypatch):
    """Shift the fake's log-sum-exp: the block's lse moves by exactly that, and the backward (which
    reads it) no longer gives dense attention's gradients."""
    monkeypatch.setattr(attention, "KERNEL", cpu_flash(FakeFlash(lse_shift=0.5)))
    g = torch.Generator().manual_seed(6)
    T, H, hd = 24, 2, 8
    q, k, v = (torch.randn(T, H, hd, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 10, T])
    rows = attention.cu_seqlens_rows(cu)
    _, lse = bt.block_forward(q.detach(), k.detach(), v.detach(), rows, rows)
    monkeypatch.setattr(attention, "KERNEL", fused.Kernel())
    _, lse_ref = bt.block_forward(q.detach(), k.detach(), v.detach(), rows, rows)
    assert rel(lse - 0.5, lse_ref) < 1e-12
    monkeypatch.setattr(attention, "KERNEL", cpu_flash(FakeFlash(lse_shift=0.5)))
    gq = torch.autograd.grad(bt.varlen_attention(q, k, v, cu).sum(), q)[0]
    pos, seg = rows._cpu
    gq_ref = torch.autograd.grad(reference_attention(q, k, v, pos, seg, pos, seg).sum(), q)[0]
    assert rel(gq, gq_ref) > 0.1


def ring_layout(segs, D):
    """Every member's Rows of a ring item of these segment lengths, and each member's row indices in
    the item's rows (segment by segment, by position)."""
    plan = bt.StepPlan(n_ranks=D, seq_doc=list(range(len(segs))), seq_start=[0] * len(segs), seq_len=list(segs),
                       items=[(tuple(range(D)), tuple((i, 0, n) for i, n in enumerate(segs)))], labelled=0)
    base = np.concatenate([[0], np.cumsum(segs)])
    rows, idx = [], []
    for m in range(D):
        pos, seg = plan.member_rows(0, m)
        rows.append(bt.Rows(torch.from_numpy(pos), torch.from_numpy(seg)))
        idx.append(torch.from_numpy(base[seg] + pos))
    return rows, idx


@pytest.mark.parametrize("segs,D", [([37], 2), ([37], 3), ([5, 100, 1, 23], 3), ([64, 9], 4), ([3], 4)])
def test_ring_blocks_through_the_fused_kernel(segs, D, monkeypatch):
    """Ring blocks (chunks m and 2D-1-m of every segment): every block decomposes (a causal call for
    the member's own block, a full call for earlier chunks), and the blocks merged give dense
    attention of the whole item, as the ring's forward merges them."""
    fake = FakeFlash()
    monkeypatch.setattr(attention, "KERNEL", cpu_flash(fake))
    g = torch.Generator().manual_seed(len(segs) * 10 + D)
    T, H, G, hd = sum(segs), 4, 2, 8
    q, k, v = (torch.randn(T, n, hd, generator=g, dtype=torch.float64) for n in (H, G, G))
    gpos = torch.cat([torch.arange(n) for n in segs])
    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
    ref = reference_attention(q, k, v, gpos, gseg, gpos, gseg)
    rows, idx = ring_layout(segs, D)
    for m in range(D):
        if rows[m].n == 0:
            continue
        out = lse = None
        for j in range(D):
            if rows[j].n == 0:
                continue
            assert rows[m].fused_plan(rows[j]) is not None, (m, j)
            before = len(fake.calls)
            o, l = bt.block_forward(q[idx[m]], k[idx[j]], v[idx[j]], rows[m], rows[j])
            causal = [c["causal"] for c in fake.calls[before:]]
            assert causal.count(True) == (1 if j == m else 0)
            out, lse = (o, l) if out is None else bt.merge(out, lse, o, l)
        assert rel(out, ref[idx[m]]) < 1e-12, (m, segs, D)


def test_ulysses_and_fallback_blocks(monkeypatch):
    """Rows sorted by (segment, position), as a Ulysses member holds its group's rows, decompose; a
    block whose key range straddles the queries' (not a plan layout) has no plan and runs the
    blockwise kernel, as do dtypes the kernel does not take."""
    fake = FakeFlash()
    monkeypatch.setattr(attention, "KERNEL", cpu_flash(fake))
    segs, D = [50, 7, 31], 4
    rows, _ = ring_layout(segs, D)
    from bytescale.torch.ulysses import _sorted_rows
    srt, _ = _sorted_rows(rows[0:2])  # group 0 of a hybrid of 2 x 2: chunks 0, 1, 6, 7
    other, _ = _sorted_rows(rows[2:4])  # group 1: chunks 2-5
    assert srt.fused_plan(srt) is not None and srt.fused_plan(other) is not None
    # over itself: each run causally, and chunks 6-7 over chunks 0-1 in full; over group 1: in full
    assert [c.causal for c in srt.fused_plan(srt)] == [True, False]
    assert [c.causal for c in srt.fused_plan(other)] == [False]
    T, H, hd = 20, 2, 8
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(T, H, hd, generator=g, dtype=torch.float64) for _ in range(3))
    qr = bt.Rows(torch.arange(0, 20), torch.zeros(20, dtype=torch.int64))
    kr = bt.Rows(torch.arange(5, 25), torch.zeros(20, dtype=torch.int64))
    assert qr.fused_plan(kr) is None
    before = len(fake.calls)
    o, _ = bt.block_forward(q, k, v, qr, kr)
    assert len(fake.calls) == before
    ref = reference_attention(q, k, v, qr.pos, qr.seg, kr.pos, kr.seg)
    assert rel(o, ref) < 1e-12
    attention.KERNEL.dtypes = (torch.float64,)
    bt.block_forward(q.float(), k.float(), v.float(), qr, qr)
    assert len(fake.calls) == before
    bt.block_forward(q, k, v, qr, qr)
    assert len(fake.calls) == before + 1


class FakeAtenFlash:
    """aten._scaled_dot_product_flash_attention's signature and first two results, on any device."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, dropout_p, is_causal, return_debug_mask, scale=None):
        self.calls.append((tuple(q.shape), tuple(k.shape), is_causal, scale))
        cu = torch.tensor([0, q.shape[2]])
        out, lse = dense_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu,
                                torch.tensor([0, k.shape[2]]), is_causal, scale)
        return out.transpose(0, 1).unsqueeze(0), lse.unsqueeze(0)


def test_torch_flash_ring_blocks(monkeypatch):
    """torch's flash attention, per sequence with K/V heads repeated: ring blocks merged give dense
    attention."""
    fake = FakeAtenFlash()
    kern = fused.TorchFlash(fake)
    kern.devices, kern.dtypes = ("cpu",), (torch.float64,)
    monkeypatch.setattr(attention, "KERNEL", kern)
    segs, D, H, G, hd = [41, 6], 2, 4, 2, 8
    g = torch.Generator().manual_seed(9)
    T = sum(segs)
    q, k, v = (torch.randn(T, n, hd, generator=g, dtype=torch.float64) for n in (H, G, G))
    gpos = torch.cat([torch.arange(n) for n in segs])
    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
    ref = reference_attention(q, k, v, gpos, gseg, gpos, gseg)
    rows, idx = ring_layout(segs, D)
    for m in range(D):
        o0, l0 = bt.block_forward(q[idx[m]], k[idx[0]], v[idx[0]], rows[m], rows[0])
        o1, l1 = bt.block_forward(q[idx[m]], k[idx[1]], v[idx[1]], rows[m], rows[1])
        assert rel(bt.merge(o0, l0, o1, l1)[0], ref[idx[m]]) < 1e-12
    assert fake.calls and all(c[1][1] == H and c[3] == pytest.approx(1 / math.sqrt(hd)) for c in fake.calls)


# ---- the ring's stream path ------------------------------------------------------------------------------

class Log:
    entries = []


class FakeStream:
    def __init__(self, name="comm", device=None):
        self.name = name

    def wait_stream(self, other):
        Log.entries.append(("wait_stream", self.name, other.name))

    def wait_event(self, ev):
        Log.entries.append(("wait_event", self.name, ev.id))


class FakeEvent:
    count = 0

    def __init__(self, enable_timing=False):
        FakeEvent.count += 1
        self.id = FakeEvent.count

    def record(self, stream):
        Log.entries.append(("record", stream.name, self.id))

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


class FakeStreamContext:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        Log.entries.append(("enter", self.stream.name))

    def __exit__(self, *exc):
        Log.entries.append(("exit", self.stream.name))


def stream_ring_worker(rank, world):
    """ring_attention forward and backward with the Transport's stream path forced on CPU tensors over
    gloo, stand-in CUDA streams and events logging what the path asks of them."""
    torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream = FakeStream, FakeEvent, FakeStreamContext
    torch.cuda.current_stream = lambda device=None: FakeStream("compute")
    torch.cuda.current_device = lambda: 0
    torch.Tensor.record_stream = lambda self, s: Log.entries.append(("record_stream", s.name))
    ringmod.STREAMS = True
    real = attention.block_forward

    def logged(*a, **kw):
        Log.entries.append(("block",))
        return real(*a, **kw)

    ringmod.block_forward = logged
    segs, H, G, hd = [37, 5], 4, 2, 8
    g = torch.Generator().manual_seed(world)
    T = sum(segs)
    q, k, v, dout = (torch.randn(T, n, hd, generator=g, dtype=torch.float64) for n in (H, G, G, H))
    rows, idx = ring_layout(segs, world)
    r = bt.Ring(list(range(world)), rank, rows)
    qq, kk, vv = (x[idx[rank]].clone().requires_grad_() for x in (q, k, v))
    out = bt.ring_attention(qq, kk, vv, r)
    fwd = list(Log.entries)
    out.backward(dout[idx[rank]])
    gpos = torch.cat([torch.arange(n) for n in segs])
    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
    q2, k2, v2 = (x.clone().requires_grad_() for x in (q, k, v))
    ref = reference_attention(q2, k2, v2, gpos, gseg, gpos, gseg)
    ref.backward(dout)
    i = idx[rank]
    errs = [rel(out.detach(), ref.detach()[i]), rel(qq.grad, q2.grad[i]), rel(kk.grad, k2.grad[i]),
            rel(vv.grad, v2.grad[i])]
    return errs, fwd, list(Log.entries), r.stats.compute, r.stats.wait


@pytest.mark.parametrize("world", [2, 3])
def test_ring_stream_path(world):
    """The stream path gives full attention's outputs and gradients, and in the forward every step
    runs: comm waits for compute, the messages are posted inside comm, an event recorded on comm,
    the block computed on compute, and only then compute waits for that event."""
    for rank, (errs, fwd, everything, compute, wait) in enumerate(launch.spawn(stream_ring_worker, world)):
        assert max(errs) < 1e-12, (rank, errs)
        posts = [i for i, e in enumerate(fwd) if e == ("wait_stream", "comm", "compute")]
        assert len(posts) == world - 1, (rank, fwd)  # every step but the last posts messages
        for at in posts:
            assert fwd[at + 1] == ("enter", "comm")
            ex = fwd.index(("exit", "comm"), at)
            rec = fwd[ex - 1]
            assert rec[:2] == ("record", "comm")  # the messages' completion, queued on comm
            blk = fwd.index(("block",), ex)
            assert not [e for e in fwd[ex:blk] if e[0] == "wait_event"]  # nothing waits before the block
            w = [e for e in fwd[blk:] if e[0] == "wait_event"][0]
            assert w == ("wait_event", "compute", rec[2])  # then compute waits for exactly that event
        assert ("record_stream", "comm") in fwd
        # the backward's K/V and dK/dV messages go the same way
        bwd = everything[len(fwd):]
        assert bwd.count(("wait_stream", "comm", "compute")) == bwd.count(("enter", "comm")) >= world
        assert compute > 0 and wait > 0  # the event pairs were read back (1 ms each here)


# ---- on a GPU (skipped without one: scripts/gpu_check.sh runs them where CUDA is) --------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
GPU = "cuda"  # the device of the tests below
GPU_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def dense_grads(q, k, v, dout, pos, seg):
    """Dense attention's output and gradients in fp64 on the CPU, from the same (rounded) inputs."""
    q, k, v = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    out = reference_attention(q, k, v, pos, seg, pos, seg)
    out.backward(dout.detach().cpu().double())
    return out.detach(), q.grad, k.grad, v.grad


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_varlen(dtype, monkeypatch):
    """A pack on the GPU through the process's KERNEL (fused where it takes the dtype): output and
    gradients against dense fp64 attention, and the fused kernel ran where it should."""
    calls = []
    if attention.KERNEL.fused:
        real = attention.KERNEL.varlen
        monkeypatch.setattr(attention.KERNEL, "varlen", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(3)
    lens = [1, 130, 700, 3, 290]
    T, H, G, hd = sum(lens), 8, 2, 64
    q, dout = (torch.randn(T, H, hd, generator=g).to(GPU, dtype) for _ in range(2))
    k, v = (torch.randn(T, G, hd, generator=g).to(GPU, dtype) for _ in range(2))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]))
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    out = bt.varlen_attention(qq, kk, vv, cu)
    out.backward(dout)
    rows = attention.cu_seqlens_rows(cu)
    want = dense_grads(q, k, v, dout, *rows._cpu)
    for x, y in zip((out, qq.grad, kk.grad, vv.grad), want):
        assert x.device.type == GPU and x.dtype == dtype
        assert rel(x.detach().cpu().double(), y) < GPU_TOL[dtype]
    assert bool(calls) == (attention.KERNEL.fused and attention.KERNEL.accepts(q))


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_ring_and_stream_path_threads(dtype, monkeypatch):
    """A ring of 3 members as threads on one GPU, the Mailbox as transport, through the real stream
    path (side stream, events) and KERNEL: forward and backward (ring_forward / ring_backward called
    directly: autograd would run every member's backward on its one CUDA thread) against dense fp64
    attention of the whole item."""
    mail = Mailbox()
    monkeypatch.setattr(ringmod, "_exchange", mail.exchange)
    D, segs, H, G, hd = 3, [900, 77], 8, 2, 64
    rows, idx = ring_layout(segs, D)
    g = torch.Generator().manual_seed(4)
    T = sum(segs)
    q, dout = (torch.randn(T, H, hd, generator=g).to(GPU, dtype) for _ in range(2))
    k, v = (torch.randn(T, G, hd, generator=g).to(GPU, dtype) for _ in range(2))
    gpos = torch.cat([torch.arange(n) for n in segs])
    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
    want = dense_grads(q, k, v, dout, gpos, gseg)

    def member(r):
        mail.local.rank = r
        i = idx[r].to(GPU)
        ring = bt.Ring(list(range(D)), r, rows)
        out, lse = ringmod.ring_forward(q[i], k[i], v[i], ring)
        grads = ringmod.ring_backward(dout[i], q[i], k[i], v[i], out, lse, ring)
        if GPU == "cuda":
            torch.cuda.synchronize()
        return [x.cpu().double() for x in (out, *grads)], ring.stats.compute, ring.stats.wait

    for r, (got, compute, wait) in enumerate(run_threads(D, member)):
        for x, y in zip(got, want):
            assert rel(x, y[idx[r]]) < GPU_TOL[dtype] * 3, r
        assert compute > 0 and wait >= 0


@cuda
def test_cuda_model_matches_cpu():
    """The tiny model's loss and gradients on the GPU (fp32) against the same on the CPU (fp64)."""
    cfg = bt.LlamaConfig.named("tiny")
    lens = [300, 45]
    T = sum(lens)
    pos = torch.cat([torch.arange(n) for n in lens])
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    g = torch.Generator().manual_seed(8)
    tokens = torch.randint(0, cfg.vocab_size, (T,), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (T,), generator=g)
    mb = types.SimpleNamespace(rows=bt.Rows(pos, seg), ring=None, ulysses=None)
    res = {}
    for dev, dt in (("cpu", torch.float64), (GPU, torch.float32)):
        model = bt.Llama(cfg, dtype=dt, device=dev)
        with torch.no_grad():
            model.flat.copy_(bt.Llama(cfg, dtype=torch.float64).init_weights(2).flat.to(dev, dt))
        with bt.microbatch_context(mb):
            loss = model.loss_sum(tokens.to(dev), targets.to(dev), pos.to(dev))
        loss.backward()
        res[dev] = (float(loss), torch.cat([p.grad.reshape(-1) for _, p in model.named_flat_parameters()]))
    assert abs(res[GPU][0] - res["cpu"][0]) / abs(res["cpu"][0]) < 1e-5
    assert rel(res[GPU][1].cpu().double(), res["cpu"][1]) < 1e-4


def nccl_worker(rank, world):
    """Ring and a2a attention over NCCL, one GPU per rank, fp32: against dense attention."""
    segs, H, G, hd = [1000, 33], 8, 2, 64
    g = torch.Generator().manual_seed(11)
    T = sum(segs)
    q, dout = (torch.randn(T, H, hd, generator=g) for _ in range(2))
    k, v = (torch.randn(T, G, hd, generator=g) for _ in range(2))
    gpos = torch.cat([torch.arange(n) for n in segs])
    gseg = torch.cat([torch.full((n,), i) for i, n in enumerate(segs)])
    want = dense_grads(q, k, v, dout, gpos, gseg)
    rows, idx = ring_layout(segs, world)
    i = idx[rank]
    errs = []
    for kind in ("ring", "a2a"):
        qq, kk, vv = (x[i].to(GPU).requires_grad_() for x in (q, k, v))
        if kind == "ring":
            out = bt.ring_attention(qq, kk, vv, bt.Ring(list(range(world)), rank, rows))
        else:
            out = bt.ulysses_attention(qq, kk, vv, bt.Ulysses(list(range(world)), rank, rows, world))
        out.backward(dout[i].to(GPU))
        errs.append(max(rel(x.detach().cpu().double(), y[i]) for x, y in zip((out, qq.grad, kk.grad, vv.grad), want)))
    return errs


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_ring_and_a2a():
    world = min(4, torch.cuda.device_count())
    for rank, errs in enumerate(launch.spawn(nccl_worker, world, backend="nccl")):
        assert max(errs) < 1e-4, (rank, errs)
