"""Fused attention kernels for the block kernel's forward, where one is importable (docs/torch.md, "On GPUs").

The blockwise kernel of attention.py handles any rows (positions and segment ids). A fused varlen
kernel (flash-attn's `flash_attn_varlen_func`, or torch's own flash attention) handles packed
sequences, each either causal (query i sees keys 0..i) or full (every key). The blocks HDP runs
decompose into exactly those: split the query rows and the key rows into RUNS (maximal ranges of
rows of one segment at consecutive positions); a query run and a key run of the same segment are

- hidden   when every key comes after every query,
- full     when every key is at or before every query (a ring's earlier chunk),
- diagonal when they are the same positions (a pack's document over itself, a ring member's chunk
           over the same chunk): causal attention of equal lengths.

A pack is one causal call (the documents); a ring or Ulysses block is at most one causal call (the
diagonals) and one full call (each query run against all the key runs it fully sees, concatenated:
order does not matter without a mask), merged by log-sum-exp. A block with any other overlap (not
produced by plan_chunk layouts) returns no plan, and the caller runs the blockwise kernel.

The kernel is chosen once, at import (`attention.KERNEL`); `BYTESCALE_ATTN_KERNEL=reference` (or
`flash_attn`, `aten`) overrides the automatic choice. The backward stays the blockwise kernel on
every device: it needs only the forward's log-sum-exp, which the fused kernels return.
"""

from __future__ import annotations

import os
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor


class Call(NamedTuple):
    """One varlen call of a block's plan. qi, ki: row indices (CPU int64) of the packed queries and
    keys, sequence after sequence; cu_q, cu_k: cumulative sequence lengths (CPU int64, starting at 0);
    dev: their copies per device (on(device)), made once per block plan, not per call."""

    causal: bool
    qi: Tensor
    ki: Tensor
    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    dev: dict

    def on(self, device) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """(qi, ki, cu_q, cu_k) on `device`, the cumulative lengths int32 (what varlen kernels take)."""
        key = str(device)
        if key not in self.dev:
            self.dev[key] = (self.qi.to(device), self.ki.to(device), self.cu_q.to(device, torch.int32),
                             self.cu_k.to(device, torch.int32))
        return self.dev[key]


def runs(pos: Tensor, seg: Tensor) -> List[Tuple[int, int, int, int]]:
    """[(begin, end, segment, first position)]: maximal ranges of rows of one segment whose positions
    go up by one. pos, seg: 1-D CPU int64."""
    n = int(pos.numel())
    if n == 0:
        return []
    brk = torch.ones(n, dtype=torch.bool)
    brk[1:] = (seg[1:] != seg[:-1]) | (pos[1:] != pos[:-1] + 1)
    starts = torch.nonzero(brk).flatten().tolist() + [n]
    segs, firsts = seg.tolist(), pos.tolist()
    return [(b, e, segs[b], firsts[b]) for b, e in zip(starts[:-1], starts[1:])]


def _relation(qrun, krun) -> str:
    """'hidden', 'full', 'diagonal' or 'other' for a query run and a key run of one segment."""
    qb, qe, _, q0 = qrun
    kb, ke, _, k0 = krun
    n, m = qe - qb, ke - kb
    if k0 == q0 and m == n:  # first: a one-row run over itself is also "full", but belongs with the diagonals
        return "diagonal"
    if k0 > q0 + n - 1:
        return "hidden"
    if k0 + m - 1 <= q0:
        return "full"
    return "other"


def _call(causal: bool, pairs) -> Optional[Call]:
    """A Call of [(query run, [key runs])] pairs, or None when there are none."""
    if not pairs:
        return None
    qi, ki, lq, lk = [], [], [0], [0]
    for (qb, qe, _, _), kruns in pairs:
        qi.append(torch.arange(qb, qe))
        lq.append(qe - qb)
        nk = 0
        for kb, ke, _, _ in kruns:
            ki.append(torch.arange(kb, ke))
            nk += ke - kb
        lk.append(nk)
    cu_q, cu_k = torch.tensor(lq).cumsum(0), torch.tensor(lk).cumsum(0)
    return Call(causal, torch.cat(qi), torch.cat(ki), cu_q, cu_k, max(lq), max(lk), {})


def plan_block(qpos: Tensor, qseg: Tensor, kpos: Tensor, kseg: Tensor) -> Optional[List[Call]]:
    """The varlen calls that compute the attention of queries (qpos, qseg) over keys (kpos, kseg),
    or None when some run pair is neither hidden, full nor diagonal. Every query run appears at most
    once per call, so a call's results scatter back without conflicts."""
    by_seg = {}
    for kr in runs(kpos, kseg):
        by_seg.setdefault(kr[2], []).append(kr)
    diag, full = [], []
    for qr in runs(qpos, qseg):
        seen = []
        for kr in by_seg.get(qr[2], []):
            rel = _relation(qr, kr)
            if rel == "other":
                return None
            if rel == "diagonal":
                diag.append((qr, [kr]))
            elif rel == "full":
                seen.append(kr)
        if seen:
            full.append((qr, seen))
    return [c for c in (_call(True, diag), _call(False, full)) if c is not None]


# ---- the kernels --------------------------------------------------------------------------------------

class Kernel:
    """The blockwise torch kernel of attention.py: any rows, any device, any dtype."""

    name = "reference (blockwise torch, attention.py)"
    fused = False
    devices: Tuple[str, ...] = ()
    dtypes: Tuple[torch.dtype, ...] = ()
    max_head_dim = 0

    def accepts(self, q: Tensor) -> bool:
        """Whether this kernel runs q's device, dtype and head size (else the caller falls back)."""
        hd = q.shape[-1]
        return (self.fused and q.device.type in self.devices and q.dtype in self.dtypes
                and hd % 8 == 0 and hd <= self.max_head_dim)

    def varlen(self, q: Tensor, k: Tensor, v: Tensor, call: Call, scale: float) -> Tuple[Tensor, Tensor]:
        """Packed attention of q (n, H, hd) over k, v (m, G, hd) as `call` lays them out:
        (out (n, H, hd) in q's dtype, lse (n, H), fp32 from the real kernels)."""
        raise NotImplementedError


class FlashVarlen(Kernel):
    """flash-attn's flash_attn_varlen_func (fp16 / bf16 on CUDA, GQA native, head_dim <= 256)."""

    name = "flash_attn.flash_attn_varlen_func"
    fused = True
    devices = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)
    max_head_dim = 256

    def __init__(self, fn):
        self.fn = fn

    def varlen(self, q, k, v, call, scale):
        dev = q.device
        _, _, cu_q, cu_k = call.on(dev)
        out, lse, _ = self.fn(q, k, v, cu_q, cu_k, call.max_q, call.max_k, dropout_p=0.0, softmax_scale=scale,
                              causal=call.causal, return_attn_probs=True)
        if lse.dim() == 3:  # flash-attn before 2.4: (sequences, H, max_q), padded per sequence
            lens = call.cu_q[1:] - call.cu_q[:-1]
            sid = torch.repeat_interleave(torch.arange(lens.numel()), lens)
            off = torch.arange(int(call.cu_q[-1])) - call.cu_q[:-1][sid]
            lse = lse[sid.to(dev), :, off.to(dev)]  # (n, H)
        else:  # (H, n)
            lse = lse.t()
        return out, lse


class TorchFlash(Kernel):
    """torch's own flash attention (torch >= 2.0 on CUDA): one (1, H, n, hd) call per sequence of the
    block, K/V heads repeated for GQA; no varlen entry point, so a pack of many documents makes as
    many calls. `scale=` needs torch >= 2.1."""

    name = "torch.ops.aten._scaled_dot_product_flash_attention"
    fused = True
    devices = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)
    max_head_dim = 256

    def __init__(self, op):
        self.op = op

    def varlen(self, q, k, v, call, scale):
        r = q.shape[1] // k.shape[1]
        cq, ck = call.cu_q.tolist(), call.cu_k.tolist()  # CPU: no device sync
        outs, lses = [], []
        for s in range(len(cq) - 1):
            qs = q[cq[s]:cq[s + 1]].transpose(0, 1).unsqueeze(0)  # (1, H, n, hd)
            ks = k[ck[s]:ck[s + 1]].repeat_interleave(r, dim=1).transpose(0, 1).unsqueeze(0)
            vs = v[ck[s]:ck[s + 1]].repeat_interleave(r, dim=1).transpose(0, 1).unsqueeze(0)
            res = self.op(qs, ks, vs, 0.0, call.causal, False, scale=scale)
            outs.append(res[0][0].transpose(0, 1))  # (n, H, hd)
            lses.append(res[1][0, :, :qs.shape[2]].t())  # (n, H)
        return torch.cat(outs), torch.cat(lses)


def select_kernel(choice: Optional[str] = None) -> Kernel:
    """The kernel this process uses: `choice` (default: $BYTESCALE_ATTN_KERNEL) 'reference',
    'flash_attn' or 'aten', or, unset or 'auto', the first fused kernel importable on a machine with
    CUDA: flash-attn, then torch's flash attention, else the blockwise kernel."""
    choice = choice if choice is not None else os.environ.get("BYTESCALE_ATTN_KERNEL", "auto")
    if choice not in ("auto", "reference", "flash_attn", "aten"):
        raise ValueError(f"BYTESCALE_ATTN_KERNEL={choice!r}: auto, reference, flash_attn or aten")
    if choice == "reference" or (choice == "auto" and not torch.cuda.is_available()):
        return Kernel()
    if choice in ("auto", "flash_attn"):
        try:
            from flash_attn import flash_attn_varlen_func
            return FlashVarlen(flash_attn_varlen_func)
        except ImportError:
            if choice == "flash_attn":
                raise
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
    if op is not None and _takes_scale(op):
        return TorchFlash(op)
    if choice == "aten":
        raise ImportError(f"torch {torch.__version__} has no aten._scaled_dot_product_flash_attention with scale= "
                          f"(torch >= 2.1)")
    return Kernel()


def _takes_scale(op) -> bool:
    """Whether torch's flash attention op takes `scale=` (torch 2.1 on; 2.0's has no softmax scale)."""
    try:
        return "scale" in str(op.default._schema)
    except AttributeError:
        return False
