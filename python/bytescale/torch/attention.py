"""Blockwise attention in plain torch: the local kernel that packs and ring blocks share.

Rows carry a position and a segment id; query i sees key j iff seg[j] == seg[i] and pos[j] <= pos[i]
(docs/model.md). The kernel never builds a dense (queries x keys) mask: it walks tiles of query rows
against tiles of key rows with an online softmax (running max and log-sum-exp, as flash attention
does), skips tiles the mask hides entirely, and applies the mask only to the tiles it cuts. So a
32K-token pack costs (tile x tile) memory, not 32K x 32K.

Layout (the C engine's): q (T, H, hd), k and v (T, G, hd), H a multiple of G (GQA: query head h uses
K/V head h // (H // G)). The forward returns the output and the log-sum-exp of every (row, head),
which the backward needs and which ring attention merges over K/V blocks (`merge`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import fused
from .shapes import check_qkv

# Tile sizes: big enough that each matmul amortises torch's per-call overhead, small enough that
# a score tile (G x r*Q_TILE x K_TILE) stays a few MB whatever the sequence length.
Q_TILE = 512
K_TILE = 1024


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics in fp32 for half types, else the input's own precision (fp64 stays fp64)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---- autocast (docs/torch-precision.md) ----------------------------------------------------------------
#
# Under torch.autocast the kernels below would lose their fp32 accumulation: autocast recasts the
# fp32 operands of every bmm they run to bf16 (fp16), so scores, softmax weights and the partial outputs
# of a ring would all be rounded to 8 bits of mantissa. And a model under autocast hands attention q,
# k, v in mixed dtypes (v straight from a bf16 linear, q and k through an fp32 RoPE). So every entry
# point does what autocast does for F.scaled_dot_product_attention: q, k, v go to the autocast dtype
# (autocast_inputs), the output comes back in it; inside, the kernels run with autocast off
# (no_autocast), forward and backward, so their accumulation dtype is the one _acc_dtype names.
# torch.amp.custom_fwd / custom_bwd do not fit: custom_fwd casts to ONE dtype fixed when the function
# is defined, and custom_bwd replays the forward's autocast state in the backward, where the point is
# to have none.

def _autocast_on(t: Tensor) -> bool:
    """Whether autocast is on for t's device (never for a device autocast has no notion of: meta)."""
    dev = t.device.type
    return torch.amp.is_autocast_available(dev) and torch.is_autocast_enabled(dev)


def _autocast_dtype(t: Tensor) -> Optional[torch.dtype]:
    """The dtype autocast runs t's device's matmuls in, None when autocast is off there."""
    return torch.get_autocast_dtype(t.device.type) if _autocast_on(t) else None


def autocast_inputs(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k, v as autocast would give them to a lower-precision op (F.scaled_dot_product_attention):
    every fp32 / fp16 / bf16 one in the autocast dtype of its device when autocast is on there (fp64
    is left alone, as autocast leaves it); unchanged otherwise."""
    dtype = _autocast_dtype(q)
    if dtype is None:
        return q, k, v
    eligible = (torch.float32, torch.float16, torch.bfloat16)
    return tuple(t.to(dtype) if t.dtype in eligible else t for t in (q, k, v))


def no_autocast(t: Tensor):
    """A context with autocast off on t's device (a null context where it is off already): the
    kernels' own accumulation dtype holds inside (see autocast_inputs)."""
    if _autocast_on(t):
        return torch.autocast(t.device.type, enabled=False)
    return contextlib.nullcontext()


class Rows:
    """Positions and segment ids of a set of rows, with the per-tile summaries the kernel's skip
    test needs, kept on the CPU (the tile plan is Python control flow; no device sync per tile).

    pos, seg: 1-D integer tensors of one length (any device; a CPU copy is kept for planning).
    """

    def __init__(self, pos: Tensor, seg: Tensor):
        if pos.shape != seg.shape or pos.dim() != 1:
            raise ValueError(f"pos {tuple(pos.shape)} and seg {tuple(seg.shape)} must be 1-D of one length")
        self.pos = pos
        self.seg = seg
        self.n = int(pos.numel())
        self._cpu = (pos.detach().to("cpu", torch.int64), seg.detach().to("cpu", torch.int64))
        self._dev = {}
        self._tiles = {}
        self._plans = []  # [(key Rows, fused.plan_block's calls)], the blocks this Rows queried

    def on(self, device: torch.device) -> Tuple[Tensor, Tensor]:
        """pos and seg on `device` (cached)."""
        key = str(device)
        if key not in self._dev:
            self._dev[key] = (self.pos.to(device, torch.int64), self.seg.to(device, torch.int64))
        return self._dev[key]

    def tiles(self, size: int):
        """[(begin, end, seg_min, seg_max, pos_min, pos_max)] for tiles of `size` rows (cached)."""
        if size not in self._tiles:
            pos, seg = self._cpu
            out = []
            for b in range(0, self.n, size):
                e = min(self.n, b + size)
                s, p = seg[b:e], pos[b:e]
                out.append((b, e, int(s.min()), int(s.max()), int(p.min()), int(p.max())))
            self._tiles[size] = out
        return self._tiles[size]

    def fused_plan(self, keys: "Rows"):
        """fused.plan_block of these rows (as queries) over `keys` (cached per key Rows object)."""
        for kr, calls in self._plans:
            if kr is keys:
                return calls
        calls = fused.plan_block(*self._cpu, *keys._cpu)
        self._plans.append((keys, calls))
        return calls

    def __len__(self) -> int:
        return self.n


def _hidden(qt, kt) -> bool:
    """True when no (query, key) pair of the two tiles can be visible: segment ranges disjoint, or
    one segment on both sides with every key after every query. Conservative: a tile it keeps may
    still be fully masked (the mask then zeroes it)."""
    _, _, qs0, qs1, _, qp1 = qt
    _, _, ks0, ks1, kp0, _ = kt
    if ks1 < qs0 or ks0 > qs1:
        return True
    return qs0 == qs1 == ks0 == ks1 and kp0 > qp1


def _full(qt, kt) -> bool:
    """True when every pair of the two tiles is visible: one segment, every key at or before every query."""
    _, _, qs0, qs1, qp0, _ = qt
    _, _, ks0, ks1, _, kp1 = kt
    return qs0 == qs1 == ks0 == ks1 and kp1 <= qp0


def _group_q(x: Tensor, G: int) -> Tensor:
    """(T, H, d) -> (G, r*T, d): the r query heads of each K/V head stacked head-major, so one batched
    matmul per K/V head serves the whole GQA group (no K/V repeat)."""
    T, H, d = x.shape
    r = H // G
    return x.reshape(T, G, r, d).permute(1, 2, 0, 3).reshape(G, r * T, d)


def _ungroup_q(x: Tensor, T: int, H: int) -> Tensor:
    """(G, r*T, d) -> (T, H, d), the inverse of _group_q."""
    G, _, d = x.shape
    r = H // G
    return x.reshape(G, r, T, d).permute(2, 0, 1, 3).reshape(T, H, d)


def _group_rows(x: Tensor, G: int) -> Tensor:
    """(T, H) -> (G, r*T, 1), per-(row, head) statistics in the stacked layout."""
    T, H = x.shape
    r = H // G
    return x.reshape(T, G, r).permute(1, 2, 0).reshape(G, r * T, 1)


def _ungroup_rows(x: Tensor, T: int, H: int) -> Tensor:
    G = x.shape[0]
    r = H // G
    return x.reshape(G, r, T).permute(2, 0, 1).reshape(T, H)


def _tile_mask(qr: Rows, kr: Rows, qt, kt, device, r: int) -> Tensor:
    """The visibility mask of one (query tile, key tile) pair, shaped (1, r*tq, tk) for the stacked
    layout (the same mask for every query head of a group)."""
    qpos, qseg = qr.on(device)
    kpos, kseg = kr.on(device)
    qb, qe = qt[0], qt[1]
    kb, ke = kt[0], kt[1]
    m = (kseg[kb:ke][None, :] == qseg[qb:qe][:, None]) & (kpos[kb:ke][None, :] <= qpos[qb:qe][:, None])
    return m.repeat(r, 1).unsqueeze(0)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> Tuple[int, int, int]:
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"attention wants q (T, H, hd), k and v (T, G, hd); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    H, G, hd = q.shape[1], k.shape[1], q.shape[2]
    if k.shape[2] != hd or H % G != 0:
        raise ValueError(f"n_heads {H} must be a multiple of n_kv_heads {G} and head_dim match "
                         f"({hd} vs {k.shape[2]})")
    return H, G, hd


# The forward kernel of this process, chosen once (fused.select_kernel): a fused varlen kernel that
# returns the log-sum-exp where one is importable on CUDA, else the blockwise kernel below.
KERNEL = fused.select_kernel()


def block_forward(q: Tensor, k: Tensor, v: Tensor, qr: Rows, kr: Rows,
                  scale: Optional[float] = None, acc_out: bool = False) -> Tuple[Tensor, Tensor]:
    """Attention of queries q (rows qr) over keys k, v (rows kr), without autograd.

    Returns (out (Tq, H, hd) in q's dtype, or in the accumulation dtype with acc_out, lse (Tq, H) in
    the accumulation dtype). A query that sees no key gets out 0 and lse -inf (merge() treats it as
    "saw nothing"). acc_out is for the callers that merge partial outputs (a ring's blocks): rounding
    each partial to bf16 before the merge would add one rounding per block. Runs KERNEL where it takes
    q (device, dtype, head size) and the block decomposes into causal and full sequences
    (fused.plan_block), else the blockwise kernel (reference_block_forward).
    """
    H, G, hd = _check_shapes(q, k, v)
    if KERNEL.fused and q.shape[0] > 0 and k.shape[0] > 0 and KERNEL.accepts(q):
        calls = qr.fused_plan(kr)
        if calls is not None:
            return fused_block_forward(q, k, v, calls, scale, acc_out=acc_out)
    return reference_block_forward(q, k, v, qr, kr, scale, acc_out=acc_out)


def fused_block_forward(q: Tensor, k: Tensor, v: Tensor, calls, scale: Optional[float] = None,
                        kernel=None, acc_out: bool = False) -> Tuple[Tensor, Tensor]:
    """block_forward through a fused kernel's varlen calls (fused.plan_block), merged by log-sum-exp
    in the accumulation dtype: a query run in both the causal call (its own chunk) and the full call
    (earlier chunks) gets the union of the two. Queries in no call see nothing (out 0, lse -inf)."""
    kernel = KERNEL if kernel is None else kernel
    Tq, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    acc_t = _acc_dtype(q.dtype)
    out = torch.zeros(Tq, H, hd, dtype=acc_t, device=q.device)
    lse = torch.full((Tq, H), -math.inf, dtype=acc_t, device=q.device)
    for c in calls:
        qi, ki, _, _ = c.on(q.device)
        o, l = kernel.varlen(q.index_select(0, qi), k.index_select(0, ki), v.index_select(0, ki), c, scale)
        o, l = merge(out.index_select(0, qi), lse.index_select(0, qi), o, l.to(lse.dtype))
        out.index_copy_(0, qi, o)
        lse.index_copy_(0, qi, l)
    return (out if acc_out else out.to(q.dtype)), lse


def reference_block_forward(q: Tensor, k: Tensor, v: Tensor, qr: Rows, kr: Rows,
                            scale: Optional[float] = None, acc_out: bool = False) -> Tuple[Tensor, Tensor]:
    """block_forward's blockwise kernel (online softmax over tiles), for any rows, device and dtype."""
    H, G, hd = _check_shapes(q, k, v)
    Tq, Tk, r = q.shape[0], k.shape[0], H // G
    acc_t = _acc_dtype(q.dtype)
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    out = torch.zeros(Tq, H, hd, dtype=acc_t if acc_out else q.dtype, device=q.device)
    lse = torch.full((Tq, H), -math.inf, dtype=acc_t, device=q.device)
    if Tq == 0 or Tk == 0:
        return out, lse
    kg = k.permute(1, 0, 2).to(acc_t)  # (G, Tk, hd)
    vg = v.permute(1, 0, 2).to(acc_t)
    ktiles = kr.tiles(K_TILE)
    for qt in qr.tiles(Q_TILE):
        qb, qe = qt[0], qt[1]
        tq = qe - qb
        qg = _group_q(q[qb:qe].to(acc_t), G) * scale  # (G, r*tq, hd)
        m = torch.full((G, r * tq, 1), -math.inf, dtype=acc_t, device=q.device)  # running max
        l = torch.zeros((G, r * tq, 1), dtype=acc_t, device=q.device)  # running sum of exp(s - m)
        acc = torch.zeros((G, r * tq, hd), dtype=acc_t, device=q.device)
        seen = False
        for kt in ktiles:
            if _hidden(qt, kt):
                continue
            seen = True
            kb, ke = kt[0], kt[1]
            s = torch.bmm(qg, kg[:, kb:ke].transpose(1, 2))  # (G, r*tq, tk)
            if not _full(qt, kt):
                s = s.masked_fill(~_tile_mask(qr, kr, qt, kt, q.device, r), -math.inf)
            m_new = torch.maximum(m, s.amax(dim=2, keepdim=True))
            # rows that have seen nothing yet keep m = -inf: shift by 0 there so exp gives 0, not nan
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - shift)
            alpha = torch.exp(m - shift)
            l = l * alpha + p.sum(dim=2, keepdim=True)
            acc = acc * alpha + torch.bmm(p, vg[:, kb:ke])
            m = m_new
        if not seen:
            continue
        ok = l > 0
        o = torch.where(ok, acc / torch.where(ok, l, torch.ones_like(l)), torch.zeros_like(acc))
        ls = torch.where(ok, m + torch.log(torch.where(ok, l, torch.ones_like(l))),
                         torch.full_like(l, -math.inf))
        out[qb:qe] = _ungroup_q(o, tq, H).to(out.dtype)
        lse[qb:qe] = _ungroup_rows(ls, tq, H)
    return out, lse


def block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor, qr: Rows, kr: Rows,
                   scale: Optional[float] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of the attention of q over (k, v) given the FINAL lse of every query (over all keys
    it sees, this block or not) and delta = rowsum(dout * out) (Tq, H): the flash-attention backward,
    which makes a block's contribution independent of the other blocks. Returns (dq, dk, dv) of this
    block, in the accumulation dtype: dq (Tq, H, hd), dk and dv (Tk, G, hd), summed over queries."""
    H, G, hd = _check_shapes(q, k, v)
    Tq, Tk, r = q.shape[0], k.shape[0], H // G
    acc_t = _acc_dtype(q.dtype)
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    dq = torch.zeros(Tq, H, hd, dtype=acc_t, device=q.device)
    dk = torch.zeros(G, Tk, hd, dtype=acc_t, device=q.device)
    dv = torch.zeros(G, Tk, hd, dtype=acc_t, device=q.device)
    if Tq == 0 or Tk == 0:
        return dq, dk.permute(1, 0, 2).contiguous(), dv.permute(1, 0, 2).contiguous()
    kg = k.permute(1, 0, 2).to(acc_t)
    vg = v.permute(1, 0, 2).to(acc_t)
    ktiles = kr.tiles(K_TILE)
    for qt in qr.tiles(Q_TILE):
        qb, qe = qt[0], qt[1]
        tq = qe - qb
        qg = _group_q(q[qb:qe].to(acc_t), G)
        dog = _group_q(dout[qb:qe].to(acc_t), G)
        lg = _group_rows(lse[qb:qe].to(acc_t), G)
        # a query that saw no key at all (lse -inf; never the case for causal rows, which see
        # themselves) has no gradient: shift it by +inf so that p = exp(s - inf) = 0, not inf
        lg = torch.where(torch.isinf(lg), torch.full_like(lg, math.inf), lg)
        dg = _group_rows(delta[qb:qe].to(acc_t), G)
        dqg = torch.zeros_like(qg)
        for kt in ktiles:
            if _hidden(qt, kt):
                continue
            kb, ke = kt[0], kt[1]
            s = torch.bmm(qg, kg[:, kb:ke].transpose(1, 2)) * scale
            p = torch.exp(s - lg)
            if not _full(qt, kt):
                p = p.masked_fill(~_tile_mask(qr, kr, qt, kt, q.device, r), 0.0)
            dv[:, kb:ke] += torch.bmm(p.transpose(1, 2), dog)
            dp = torch.bmm(dog, vg[:, kb:ke].transpose(1, 2))
            ds = p * (dp - dg) * scale
            dqg += torch.bmm(ds, kg[:, kb:ke])
            dk[:, kb:ke] += torch.bmm(ds.transpose(1, 2), qg)
        dq[qb:qe] = _ungroup_q(dqg, tq, H)
    return dq, dk.permute(1, 0, 2).contiguous(), dv.permute(1, 0, 2).contiguous()


def merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """The online-softmax union of two partial attentions over disjoint key sets: the result is what
    one softmax over both key sets gives. lse -inf means "saw nothing" on that side. Computed in
    lse's dtype (the accumulation dtype); the result has out_a's dtype, so the callers that merge many
    blocks keep out_a in the accumulation dtype and round once at the end."""
    mx = torch.maximum(lse_a, lse_b)
    shift = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    wa, wb = torch.exp(lse_a - shift), torch.exp(lse_b - shift)
    tot = wa + wb
    ok = tot > 0
    safe = torch.where(ok, tot, torch.ones_like(tot))
    lse = torch.where(ok, shift + torch.log(safe), torch.full_like(tot, -math.inf))
    wa, wb = (wa / safe).unsqueeze(-1), (wb / safe).unsqueeze(-1)
    out = (out_a.to(wa.dtype) * wa + out_b.to(wb.dtype) * wb).to(out_a.dtype)
    return out, lse


class _LocalAttention(torch.autograd.Function):
    """Attention of a micro-batch's rows over themselves (queries = keys), blockwise. The output is
    kept in the accumulation dtype for the backward's rowsum(dout * out) (flash attention keeps the
    rounded one; the unrounded one is the exact softmax output) and returned in q's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, rows):
        with no_autocast(q):
            out, lse = block_forward(q, k, v, rows, rows, acc_out=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.rows = rows
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        with no_autocast(q):
            acc_t = _acc_dtype(q.dtype)
            delta = (dout.to(acc_t) * out.to(acc_t)).sum(-1)
            dq, dk, dv = block_backward(dout, q, k, v, lse, delta, ctx.rows, ctx.rows)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def local_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, seg: Tensor) -> Tensor:
    """Causal attention of T rows over themselves with per-segment masks: row i sees row j iff
    seg[j] == seg[i] and pos[j] <= pos[i]. q (T, H, hd), k and v (T, G, hd); differentiable. Under
    torch.autocast q, k, v run in the autocast dtype and so does the output (autocast_inputs)."""
    rows = pos if isinstance(pos, Rows) else Rows(pos, seg)
    q, k, v = autocast_inputs(q, k, v)
    check_qkv("attention of a pack", q, k, v, rows.n, "the micro-batch's rows (its positions and segments)")
    return _LocalAttention.apply(q, k, v, rows)


def cu_seqlens_rows(cu_seqlens: Tensor) -> Rows:
    """Rows of a pack given as cumulative sequence lengths [0, l0, l0+l1, ...]: each document is a
    segment, positions restart at 0 in each (only their order matters to the mask)."""
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    lens = cu[1:] - cu[:-1]
    if (lens < 0).any() or int(cu[0]) != 0:
        raise ValueError("cu_seqlens must start at 0 and never decrease")
    seg = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    pos = torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], lens)
    return Rows(pos, seg)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Packed variable-length causal attention, like flash-attn's varlen call: documents
    [cu_seqlens[i], cu_seqlens[i+1]) are packed along the rows and each attends causally to itself
    only. Blockwise (never a dense T x T mask). q (T, H, hd), k and v (T, G, hd); differentiable;
    under torch.autocast in the autocast dtype (autocast_inputs)."""
    n = int(cu_seqlens[-1])
    q, k, v = autocast_inputs(q, k, v)
    check_qkv("varlen attention", q, k, v, n, f"as cu_seqlens ends at {n}")
    return _LocalAttention.apply(q, k, v, cu_seqlens_rows(cu_seqlens))


def reference_attention(q: Tensor, k: Tensor, v: Tensor, qpos: Tensor, qseg: Tensor, kpos: Tensor,
                        kseg: Tensor) -> Tensor:
    """Dense attention with an explicit mask, for tests only (T x T memory)."""
    H, G, hd = _check_shapes(q, k, v)
    r = H // G
    kk = k.repeat_interleave(r, dim=1)
    vv = v.repeat_interleave(r, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(hd)
    mask = (kseg[None, :] == qseg[:, None]) & (kpos[None, :] <= qpos[:, None])
    s = s.masked_fill(~mask[None], -math.inf)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, vv)
