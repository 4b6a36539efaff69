"""Ulysses (all-to-all) and hybrid attention over torch.distributed: a2a and hybrid plan items.

An **a2a item** is a Ulysses group of u = D members; a **hybrid item** is a ring of r = D / u such
groups, group g being members g*u .. g*u+u-1 of the item's ranks (docs/plan-format.md). An a2a item
is the hybrid with r = 1, so one Function runs both. Every member holds the rows of the 2D-chunk
layout (chunks m and 2D-1-m of every segment, plan_chunk with D = n_ranks), as on a ring.

Per layer, forward:

1. all-to-all inside the group, sequence -> heads: member j sends every other member i the rows it
   holds of i's query heads and of the K/V heads those query heads use, and receives from every
   member its rows of j's heads. Member j then holds ALL the group's rows for its heads.
2. attention of those rows: locally over the group's rows (a2a), or ring attention (ring.py) over
   the r groups on the head shard (hybrid: member j of group g rings with member j of every other
   group, so u rings run side by side on disjoint ranks).
3. all-to-all back, heads -> sequence: the output rows of j's heads go home to the member that holds
   them.

Backward mirrors it: dout goes sequence -> heads, the local (or ring) backward gives dq, dk, dv on
the head shard, and they go heads -> sequence. Where a K/V head serves the query heads of several
members (u above the K/V heads of the shard, GQA), the forward replicates it to each of them and the
backward SUMS the replicas' dK/dV at the member that holds those rows: that sum is dK/dV's total.

Heads: member j of u takes query heads [j*H//u, (j+1)*H//u) (contiguous, sizes differ by at most one,
none empty since u <= H; the even split H/u when u divides H), and the K/V heads those use (head h
uses K/V head h // (H/G)). When a member's heads do not line up with whole GQA groups (H = 6, G = 3,
u = 2: heads 0-2 use K/V heads 0, 0, 1), its K/V are widened to one per query head before the kernel
and the widened gradients folded back.

All messages are point-to-point on the DEFAULT process group (a collective all_to_all would need a
process group per item's members; NCCL's own all_to_all is the same grouped send/receive), or on a 3D Layout's hdp group
(`Ulysses(group=)`), so no process group is made per item; the plan's global order keeps them
deadlock-free as it does rings (docs/torch.md).
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import guard
from .attention import Rows, _acc_dtype, autocast_inputs, block_backward, block_forward, no_autocast
from .ring import Ring, RingStats, _exchange, ring_backward, ring_forward
from .shapes import check_qkv

# point-to-point tags of the four all-to-alls (the ring's are 11-13)
TAG_A2A_FWD_IN, TAG_A2A_FWD_OUT, TAG_A2A_BWD_IN, TAG_A2A_BWD_OUT = 21, 22, 23, 24


def head_split(H: int, G: int, u: int, j: int):
    """Member j of a Ulysses group of u: (h0, h1, g0, g1), its query heads [h0, h1) of H and the K/V
    heads [g0, g1) of G they use."""
    if not 1 <= u <= H:
        raise ValueError(f"a Ulysses group of {u} members needs at least {u} query heads, got {H}")
    if H % G != 0:
        raise ValueError(f"n_heads {H} must be a multiple of n_kv_heads {G}")
    rep = H // G
    h0, h1 = j * H // u, (j + 1) * H // u
    return h0, h1, h0 // rep, (h1 - 1) // rep + 1


def _sorted_rows(parts: Sequence[Rows]):
    """The rows of several members as one Rows in (segment, position) order, and the permutation:
    sorted = concatenation[perm]. Sorted rows let the kernel skip the tiles the causal mask hides."""
    if not parts:
        none = torch.zeros(0, dtype=torch.int64)
        return Rows(none, none), none
    pos = torch.cat([p._cpu[0] for p in parts])
    seg = torch.cat([p._cpu[1] for p in parts])
    key = seg * (int(pos.max()) + 1 if pos.numel() else 1) + pos
    perm = torch.sort(key, stable=True).indices
    return Rows(pos[perm], seg[perm]), perm


class Ulysses:
    """One a2a or hybrid item as this rank sees it.

    ranks   the item's global ranks, in the plan's order (D of them)
    me      this rank's member index
    rows    D Rows (or (pos, seg) pairs): member m's rows, in the order it holds them
    u       Ulysses group size: D for an a2a item, 2 <= u < D dividing D for a hybrid
    stats   a RingStats where wait / bytes are accumulated (and the hybrid's ring blocks)
    group   the process group the messages go on (None: the default group; `ranks` are the default
            group's ranks either way)
    """

    def __init__(self, ranks: Sequence[int], me: int, rows: Sequence, u: int, stats: Optional[RingStats] = None,
                 group=None):
        self.ranks = [int(r) for r in ranks]
        D = len(self.ranks)
        if D < 2 or len(set(self.ranks)) != D:
            raise ValueError(f"a Ulysses item needs >= 2 distinct ranks, got {self.ranks}")
        if not (2 <= u <= D and D % u == 0):
            raise ValueError(f"Ulysses group size {u} on {D} ranks: it must be 2..{D} and divide {D}")
        if not 0 <= me < D or len(rows) != D:
            raise ValueError(f"member {me} / {len(rows)} members' rows for an item of {D} ranks")
        rows = [r if isinstance(r, Rows) else Rows(*r) for r in rows]
        self.u, self.r = u, D // u
        self.g, self.j = divmod(me, u)
        self.stats = stats if stats is not None else RingStats()
        self.pg = group
        self.group = self.ranks[self.g * u:(self.g + 1) * u]  # global ranks of this member's group
        self.n = [rows[self.g * u + i].n for i in range(u)]  # rows each member of the group holds
        # every group's rows in (segment, position) order: the ring (hybrid) masks any group's block
        groups = [_sorted_rows(rows[gg * u:(gg + 1) * u]) for gg in range(self.r)]
        self.rows, self.perm = groups[self.g]
        self._perm_dev = None
        self.ring = None
        if self.r > 1:
            self.ring = Ring([self.ranks[gg * u + self.j] for gg in range(self.r)], self.g,
                             [gr for gr, _ in groups], self.stats, group)

    def __repr__(self):
        return f"Ulysses(ranks={self.ranks}, u={self.u}, r={self.r}, group={self.g}, member={self.j})"

    def rows_perm(self, device) -> Tensor:
        """self.perm on `device` (cached): indexing device tensors with a device index, no copy per call."""
        if self._perm_dev is None or self._perm_dev.device != torch.device(device):
            self._perm_dev = self.perm.to(device)
        return self._perm_dev

    # ---- the all-to-all ------------------------------------------------------------------------------

    def _all_to_all(self, parts: List[Tensor], sizes: List[int], tag: int) -> List[Tensor]:
        """parts[i]: the flat tensor for group member i (parts[j] stays here); sizes[i]: elements member
        i sends here. Returns what each member sent, got[j] = parts[j]. Empty messages are not sent
        (both sides know every size from the plan and the head split)."""
        ops, got = [], [None] * self.u
        for i in range(self.u):
            if i == self.j:
                got[i] = parts[i]
                continue
            got[i] = parts[i].new_empty(sizes[i])
            if sizes[i] > 0:
                ops.append(dist.P2POp(dist.irecv, got[i], self.group[i], self.pg, tag=tag))
            if parts[i].numel() > 0:
                ops.append(dist.P2POp(dist.isend, parts[i], self.group[i], self.pg, tag=tag))
                self.stats.bytes_sent += parts[i].numel() * parts[i].element_size()
        t0 = time.perf_counter()
        # a member that failed leaves; its peers' waits then fail, and name it and its error (guard.py)
        with guard.waiting(f"the all-to-all of item {self.ranks} (member {self.g * self.u + self.j})",
                           [p for i, p in enumerate(self.group) if i != self.j]):
            for w in _exchange(ops):
                w.wait()
        self.stats.wait += time.perf_counter() - t0
        return got

    def _ranges(self, total: int, H: int, G: int, kind: str):
        """Every member's [lo, hi) of a tensor with `total` heads: query heads (kind "q") or K/V heads."""
        out = []
        for i in range(self.u):
            h0, h1, g0, g1 = head_split(H, G, self.u, i)
            out.append((h0, h1) if kind == "q" else (g0, g1))
        assert out[-1][1] == total
        return out

    def to_heads(self, xs: List[Tensor], kinds: List[str], H: int, G: int, tag: int) -> List[Tensor]:
        """Sequence -> heads. xs[t] (n_me, heads_t, hd): this member's rows of every head. Returns, for
        each, (N, heads of this member, hd): the whole group's rows in (segment, position) order."""
        hd = xs[0].shape[2]
        rng = [self._ranges(x.shape[1], H, G, kd) for x, kd in zip(xs, kinds)]
        parts = [torch.cat([x[:, r[i][0]:r[i][1]].reshape(-1) for x, r in zip(xs, rng)]) for i in range(self.u)]
        mine = [r[self.j][1] - r[self.j][0] for r in rng]  # heads of each tensor this member takes
        got = self._all_to_all(parts, [n * sum(mine) * hd for n in self.n], tag)
        # a message is tensor after tensor: member i's rows of tensor 0's heads, then tensor 1's, ...
        out = []
        for t, w in enumerate(mine):
            pieces = []
            for i in range(self.u):
                at = self.n[i] * sum(mine[:t]) * hd
                pieces.append(got[i][at:at + self.n[i] * w * hd].view(self.n[i], w, hd))
            out.append(torch.cat(pieces)[self.rows_perm(xs[0].device)])  # (N, w, hd): member order, then sorted
        return out

    def to_seq(self, ys: List[Tensor], kinds: List[str], heads: List[int], H: int, G: int, tag: int) -> List[Tensor]:
        """Heads -> sequence, the inverse of to_heads. ys[t] (N, heads of this member, hd) in sorted
        order; heads[t]: the full head count of tensor t. Returns (n_me, heads[t], hd) per tensor;
        where members' K/V head ranges overlap (replicated K/V heads) their pieces are SUMMED."""
        hd = ys[0].shape[2]
        unsorted = []
        for y in ys:
            z = torch.empty_like(y)
            z[self.rows_perm(y.device)] = y  # back to member order
            unsorted.append(z)
        starts = [0]
        for n in self.n:
            starts.append(starts[-1] + n)
        parts = [torch.cat([z[starts[i]:starts[i + 1]].reshape(-1) for z in unsorted]) for i in range(self.u)]
        rng = [self._ranges(h, H, G, kd) for h, kd in zip(heads, kinds)]
        width = [sum(r[i][1] - r[i][0] for r in rng) for i in range(self.u)]  # heads member i sends
        got = self._all_to_all(parts, [self.n[self.j] * w * hd for w in width], tag)
        n = self.n[self.j]
        out = [ys[0].new_zeros(n, h, hd) for h in heads]
        for i in range(self.u):
            at = 0  # tensor after tensor, as to_heads
            for t, r in enumerate(rng):
                lo, hi = r[i]
                out[t][:, lo:hi] += got[i][at:at + n * (hi - lo) * hd].view(n, hi - lo, hd)
                at += n * (hi - lo) * hd
        return out


def _kv_index(H: int, G: int, u: int, j: int) -> Optional[Tensor]:
    """For a member whose query heads do not line up with whole GQA groups: the local K/V head of each
    local query head (K/V get widened to one per query head); None when the kernel's own grouping
    (query head h' uses K/V head h' // (heads / kv heads)) already holds."""
    h0, h1, g0, g1 = head_split(H, G, u, j)
    want = torch.arange(h0, h1) // (H // G) - g0
    w, gw = h1 - h0, g1 - g0
    if w % gw == 0 and torch.equal(want, torch.arange(w) // (w // gw)):
        return None
    return want


def grp_kv_heads(H: int, G: int, u: int, j: int) -> int:
    """K/V heads member j of u holds (g1 - g0 of head_split), known without reading a device tensor."""
    _, _, g0, g1 = head_split(H, G, u, j)
    return g1 - g0


class _UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, grp):
        # an error here is recorded for the peers before it leaves (guard.py); autocast off inside
        with guard.failing(), no_autocast(q):
            return _UlyssesAttention._forward(ctx, q, k, v, grp)

    @staticmethod
    def _forward(ctx, q, k, v, grp):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        H, G = q.shape[1], k.shape[1]
        qh, kh, vh = grp.to_heads([q, k, v], ["q", "kv", "kv"], H, G, TAG_A2A_FWD_IN)
        idx = _kv_index(H, G, grp.u, grp.j)
        if idx is not None:  # (N, w, hd): one K/V head per local query head
            idx = idx.to(q.device)
            kh, vh = kh[:, idx].contiguous(), vh[:, idx].contiguous()
        # oh in the accumulation dtype (a hybrid's ring blocks merged unrounded), kept so for the
        # backward; it goes home in q's dtype, rounded once (the heads do not overlap: no sum there)
        if grp.ring is None:
            oh, lse = block_forward(qh, kh, vh, grp.rows, grp.rows, acc_out=True)
        else:
            oh, lse = ring_forward(qh, kh, vh, grp.ring)
        (out,) = grp.to_seq([oh.to(q.dtype)], ["q"], [H], H, G, TAG_A2A_FWD_OUT)
        ctx.save_for_backward(qh, kh, vh, oh, lse)
        ctx.grp, ctx.idx, ctx.shape = grp, idx, (H, G)
        return out

    @staticmethod
    def backward(ctx, dout):
        with guard.failing(), no_autocast(dout):
            return _UlyssesAttention._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout):
        qh, kh, vh, oh, lse = ctx.saved_tensors
        grp, idx, (H, G) = ctx.grp, ctx.idx, ctx.shape
        (doh,) = grp.to_heads([dout.contiguous()], ["q"], H, G, TAG_A2A_BWD_IN)
        acc_t = _acc_dtype(qh.dtype)
        if grp.ring is None:
            delta = (doh.to(acc_t) * oh.to(acc_t)).sum(-1)  # (N, w): rowsum(dout * out)
            dq, dk, dv = block_backward(doh, qh, kh, vh, lse, delta, grp.rows, grp.rows)
        else:
            dq, dk, dv = ring_backward(doh, qh, kh, vh, oh, lse, grp.ring, acc_grads=True)
        dq, dk, dv = dq.to(acc_t), dk.to(acc_t), dv.to(acc_t)
        if idx is not None:  # fold the widened K/V heads' gradients back onto the heads they copy
            gw = grp_kv_heads(H, G, grp.u, grp.j)
            dk = dk.new_zeros(dk.shape[0], gw, dk.shape[2]).index_add_(1, idx, dk)
            dv = dv.new_zeros(dv.shape[0], gw, dv.shape[2]).index_add_(1, idx, dv)
        dq, dk, dv = grp.to_seq([dq, dk, dv], ["q", "kv", "kv"], [H, G, G], H, G, TAG_A2A_BWD_OUT)
        return dq.to(qh.dtype), dk.to(kh.dtype), dv.to(vh.dtype), None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, group: Ulysses) -> Tensor:
    """Attention of this member's rows over the whole item's rows for an a2a or hybrid item,
    differentiable. q (T, H, hd), k and v (T, G, hd): this member's rows after RoPE (T =
    rows the plan gives it, possibly 0), every head. Every member of the item calls it at the same
    point of its schedule, forward and (through autograd) backward. Under torch.autocast q, k, v
    (and the output) are in the autocast dtype; partial outputs and the replicas' dK/dV add up in
    fp32 (docs/torch-precision.md)."""
    q, k, v = autocast_inputs(q, k, v)
    kind = "a2a attention" if group.r == 1 else "hybrid attention"
    check_qkv(kind, q, k, v, group.n[group.j],
              f"the rows the plan gives this rank (member {group.g * group.u + group.j} of item {group.ranks})",
              min_heads=group.u)
    return _UlyssesAttention.apply(q, k, v, group)
