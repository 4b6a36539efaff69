"""Pipeline stages: one stage's share of a step, 1F1B in the planner's order (PP-Balance), the C
engine's src/runtime/pipeline.c in torch (docs/runtime.md, "Pipeline stages").

Every stage of HDP rank h runs all of h's items, forward of its layers and later backward. An item's
slot is 1 + the largest slot of the earlier items sharing an HDP rank with it (pp - 1 slots skipped at
a barrier: plan_pipeline_slots); stage s of P runs the forward of an item of slot q at key 2 (q + s)
and its backward at key 2 (q + P) - 1, in increasing key: P - 1 - s forwards ahead, then one forward
and one backward in turn, the last stage each backward right after its forward. Activations
(T x d_model) go to the next stage on the layout's forward pipe group and their gradients back on the
backward pipe group: non-blocking sends, blocking receives, sizes known from the plan (an empty
micro-batch sends nothing).

No wait can form a cycle (the C engine's argument): give every operation the pair (key, s') with
s' = s for a forward and P - 1 - s for a backward. An operation waits only for the same operation of
the same item on its ring or all-to-all peers (same stage and tp rank of the item's HDP ranks: the
same pair), for the item's forward on the previous stage (a smaller key) or its backward on the next
(the same key, a smaller s'), and for its tp group, whose members run the same operations in the same
order. Every process runs its operations in increasing pair order and sends never block, so the
smallest pair not yet done anywhere can always complete.
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import guard
from .model import Llama, microbatch_context
from .step import MicroBatch, StepPlan

TAG_ACT, TAG_GRAD = 201, 202


def pipeline_slots(plan: StepPlan, pp: int) -> List[int]:
    """Every item's slot (src/plan/plan.c slots_fill): 1 + the latest slot of its ranks' earlier
    items; at a barrier every rank's latest slot becomes the largest so far + pp - 1."""
    last = [-1] * plan.n_ranks
    top, w, out = -1, 0, []
    barriers = list(plan.barriers or [])
    for k, (ranks, _) in enumerate(plan.items):
        if w < len(barriers) and barriers[w] == k:
            last = [top + pp - 1] * plan.n_ranks
            w += 1
        s = max([last[r] + 1 for r in ranks] + [0])
        for r in ranks:
            last[r] = s
        out.append(s)
        top = max(top, s)
    return out


def stage_order(plan: StepPlan, hdp_rank: int, stage: int, pp: int) -> List[Tuple[bool, int]]:
    """Stage `stage`'s operations on HDP rank `hdp_rank`'s items: (forward?, index into the rank's
    micro-batch list), by key as pipeline_run takes them."""
    slot = pipeline_slots(plan, pp)
    items = plan.schedule(hdp_rank)
    out, fi, bi, n = [], 0, 0, len(items)
    while bi < n:
        fwd = fi < n and 2 * (slot[items[fi]] + stage) < 2 * (slot[items[bi]] + pp) - 1
        out.append((True, fi) if fwd else (False, bi))
        fi, bi = (fi + 1, bi) if fwd else (fi, bi + 1)
    return out


class PipeStats:
    """Seconds blocked receiving from a neighbouring stage, bytes sent to them, operations run."""

    def __init__(self):
        self.p2p_wait = 0.0
        self.p2p_bytes = 0
        self.ops = 0


def _recv(shape, like: Tensor, src: int, group, tag: int, stats: PipeStats) -> Tensor:
    buf = torch.empty(shape, dtype=like.dtype, device=like.device)
    if buf.numel() > 0:
        t0 = time.perf_counter()
        what = "activations from the previous stage" if tag == TAG_ACT else "gradients from the next stage"
        with guard.waiting(f"the pipeline's {what}", [src]):  # a stage that failed is named (guard.py)
            dist.recv(buf, src, group=group, tag=tag)
        stats.p2p_wait += time.perf_counter() - t0
    return buf


def _send(t: Tensor, dst: int, group, tag: int, stats: PipeStats, sends: list) -> None:
    if t.numel() > 0:
        t = t.detach().contiguous()
        sends.append((dist.isend(t, dst, group=group, tag=tag), t))  # keep the tensor alive
        stats.p2p_bytes += t.numel() * t.element_size()


def run_stage(model: Llama, plan: StepPlan, mbs: List[MicroBatch], scale: float,
              grad_hook=None, stats: Optional[PipeStats] = None) -> float:
    """Run this stage's forwards and backwards of this HDP rank's micro-batches `mbs` (microbatches()
    with the layout) in the 1F1B order; gradients of scale x the token losses accumulate into the
    model's. Returns this stage's sum of token losses (nonzero on the last stage only). grad_hook:
    set as the model's during the last backward (the trainer's bucket all-reduces)."""
    lay = model.parallel
    S, P = lay.stage, lay.pp
    prev = lay.world_rank(S - 1, lay.hdp_rank, lay.tp_rank) if S > 0 else None
    nxt = lay.world_rank(S + 1, lay.hdp_rank, lay.tp_rank) if S < P - 1 else None
    st = stats if stats is not None else PipeStats()
    with guard.failing():  # this stage's error, recorded for the stages and peers waiting on it
        return _run_stage(model, plan, mbs, scale, grad_hook, st, prev, nxt)


def _run_stage(model: Llama, plan: StepPlan, mbs: List[MicroBatch], scale: float, grad_hook, st: PipeStats,
               prev: Optional[int], nxt: Optional[int]) -> float:
    lay = model.parallel
    S, P = lay.stage, lay.pp
    D = model.cfg.d_model
    held = {}  # micro-batch index -> (input activations or None, output or loss) between F and B
    sends, loss_sum = [], 0.0
    order = stage_order(plan, lay.hdp_rank, S, P)
    for op, (fwd, i) in enumerate(order):
        mb = mbs[i]
        if fwd:
            x = None
            if prev is not None:
                x = _recv((mb.T, D), model.flat, prev, lay.pipe_fwd, TAG_ACT, st).requires_grad_()
            with microbatch_context(mb):
                y = model.stage_forward(mb.tokens, mb.pos, x)
            if nxt is None:
                y = model.head_loss(y, mb.targets)
                loss_sum += float(y.detach())
            else:
                _send(y, nxt, lay.pipe_fwd, TAG_ACT, st, sends)
            held[i] = (x, y)
        else:
            x, y = held.pop(i)
            model.grad_hook = grad_hook if op == len(order) - 1 else None
            if nxt is None:
                (y * scale).backward()
            else:
                y.backward(_recv((mb.T, D), model.flat, nxt, lay.pipe_bwd, TAG_GRAD, st))
            model.grad_hook = None
            if prev is not None:
                dx = x.grad if x.grad is not None else torch.zeros_like(x)
                _send(dx, prev, lay.pipe_bwd, TAG_GRAD, st, sends)
        st.ops += 1
    with guard.waiting("the pipeline's sends", [r for r in (prev, nxt) if r is not None]):
        for w, _ in sends:
            w.wait()
    return loss_sum
