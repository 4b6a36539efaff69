"""The training step: this rank's micro-batches in the global order, token-level loss over the whole
global batch, gradients summed over ranks (bucket by bucket, as the backward finishes them), a
clipped AdamW step. The C engine's step (docs/training.md), in torch.

    trainer = HDPTrainer(model, lr=1e-3, warmup=20, schedule_steps=300)
    for step in range(steps):
        plan = broadcast_plan(lambda: plan_step(...))
        result = trainer.step(plan, microbatches(plan, rank, source, ring_stats=trainer.ring_stats))

Every micro-batch's loss is scaled by 1 / (labelled tokens of the whole global batch), so the summed
gradient is the gradient of the batch's mean token loss whatever the plan (and a rank without items
contributes zeros). The gradient all-reduce (SUM) runs per bucket, one per layer plus the head and
the embedding: during the rank's last micro-batch a bucket's all-reduce starts as soon as the
backward has finished it, while the layers below still compute. With `zero=True` the optimizer is
torch's ZeroRedundancyOptimizer (each rank keeps the Adam moments of its share of the parameters
and broadcasts what it updated).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Iterable, List, Optional, Union

import torch
import torch.distributed as dist

from . import guard
from .model import Llama, microbatch_context
from .ring import RingStats
from .check import check_plan
from .step import MicroBatch, StepPlan


def lr_schedule(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """The C engine's schedule (src/nn/adamw.c lr_schedule), steps from 0: linear warmup to lr, cosine
    down to min_lr at `total`, then min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def all_reduce_gradients(parameters: Union[torch.nn.Module, Iterable[torch.Tensor]], group=None, *,
                         layout=None) -> None:
    """Sum the gradients of `parameters` (a module's, or an iterable) over the ranks of `group` (default:
    every rank), in place: the gradient all-reduce of a user's own loop (HDPTrainer does its own, bucket
    by bucket). SUM, no division by the world: the loss scaled by 1 / plan.labelled already makes the
    sum the gradient of the batch's mean token loss. A parameter whose gradient is None (every one on a
    rank that ran no micro-batch this step) gets zeros first, so every rank joins the same all-reduce
    with the same sizes and ends with the summed gradient. One all-reduce per dtype and device, over a
    flat copy of the gradients in the parameters' order (the same on every rank). With a 3D `layout`
    (parallel.Layout) the sum runs over its hdp group, the processes holding the same part of the
    model, and not at all where the HDP dimension is 1."""
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if layout is not None:
        if layout.hdp == 1:
            return
        group = layout.hdp_group  # None where the HDP ranks are the whole world: the default group
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return
    kinds = {}
    for p in params:
        kinds.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in kinds.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        with guard.waiting("the gradient all-reduce"):  # a rank that failed is named (guard.py)
            dist.all_reduce(flat, group=group)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


@dataclasses.dataclass
class StepResult:
    """What one step did. loss: the global batch's token-level mean cross-entropy; grad_norm before
    clipping; clip_scale the factor applied; compute / wait / sync: this rank's seconds in forward +
    backward (ring blocks included, ring waits excluded), blocked on ring and all-to-all messages, and in
    the gradient all-reduce after its last micro-batch; items, rings (every
    item of 2 or more ranks: rings, a2a and hybrid items), tokens: this rank's share."""

    loss: float
    grad_norm: float
    clip_scale: float
    lr: float
    seconds: float
    compute: float
    wait: float
    sync: float
    items: int
    rings: int
    tokens: int
    loss_sum: float  # this rank's sum of token losses (unscaled)


class HDPTrainer:
    """Runs plans on a Llama (model.py): forward/backward of this rank's micro-batches, the gradient
    all-reduce, clipping and AdamW with the C engine's settings (betas 0.9 / 0.95, eps 1e-8,
    decoupled weight decay on matrices only, LR schedule as lr_schedule)."""

    def __init__(self, model: Llama, *, lr: float = 1e-3, min_lr: Optional[float] = None, warmup: int = 20,
                 schedule_steps: int = 300, weight_decay: float = 0.1, clip: float = 1.0, betas=(0.9, 0.95),
                 eps: float = 1e-8, zero: bool = False, overlap: bool = True):
        self.model = model
        self.lr, self.min_lr = lr, (lr / 10 if min_lr is None else min_lr)
        self.warmup, self.schedule_steps, self.clip = warmup, schedule_steps, clip
        self.step_count = 0
        self.overlap = overlap
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        # a 3D layout: gradients are summed over the hdp group (the processes holding the same part)
        self.par = model.parallel
        self.sync_group = self.par.hdp_group if self.par is not None else None
        self.sync_size = self.par.hdp if self.par is not None else self.world
        self.ring_stats = RingStats()
        self.pipe_stats = None
        # gradients live in one flat buffer with the parameters' layout: every .grad is a view, so
        # autograd accumulates in place and a bucket is a contiguous slice
        self.flat_grad = torch.zeros_like(model.flat)
        for name, off, shape, _ in model.layout:
            model.param(name).grad = self.flat_grad[off:off + math.prod(shape)].view(shape)
        decay = [model.param(n) for n, _, _, d in model.layout if d]
        no_decay = [model.param(n) for n, _, _, d in model.layout if not d]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if zero and self.sync_size > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            kw = {"process_group": self.sync_group} if self.sync_group is not None else {}
            self.opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=lr, betas=betas,
                                               eps=eps, **kw)
        else:
            self.opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
        self._buckets = model.buckets()
        self._pending = {}

    # -- gradients ------------------------------------------------------------------------------------

    def _launch(self, b: int) -> None:
        """Start bucket b's all-reduce (once per step)."""
        if self.sync_size > 1 and b not in self._pending:
            lo, hi = self._buckets[b]
            self._pending[b] = dist.all_reduce(self.flat_grad[lo:hi], group=self.sync_group, async_op=True)

    def forward_backward(self, plan: StepPlan, mbs: List[MicroBatch]):
        """Accumulate this rank's gradients of the global mean loss; returns (loss_sum, compute s)."""
        scale = 1.0 / max(1, plan.labelled)
        loss_sum = 0.0
        t0 = time.perf_counter()
        wait0 = self.ring_stats.wait
        if self.par is not None and self.par.pp > 1:
            from .pipeline import PipeStats, run_stage
            self.pipe_stats = PipeStats()
            hook = self._launch if (self.overlap and self.sync_size > 1) else None
            loss_sum = run_stage(self.model, plan, mbs, scale, hook, self.pipe_stats)
            wait0 -= self.pipe_stats.p2p_wait  # blocked on a neighbouring stage: not compute
            mbs = []
        for i, mb in enumerate(mbs):
            last = i == len(mbs) - 1
            # during the last micro-batch, every finished bucket starts its all-reduce at once
            self.model.grad_hook = self._launch if (last and self.overlap and self.sync_size > 1) else None
            with microbatch_context(mb):
                ls = self.model.loss_sum(mb.tokens, mb.targets, mb.pos)
            (ls * scale).backward()
            loss_sum += float(ls.detach())
        self.model.grad_hook = None
        if self.model.flat.is_cuda:
            torch.cuda.synchronize()
        compute = time.perf_counter() - t0 - (self.ring_stats.wait - wait0)
        return loss_sum, compute

    def sync(self) -> float:
        """Finish the gradient all-reduce (start the buckets not started yet); seconds spent here."""
        t0 = time.perf_counter()
        if self.sync_size > 1:
            for b in range(len(self._buckets)):
                self._launch(b)
            with guard.waiting("the gradient all-reduce"):  # a rank that failed is named (guard.py)
                for w in self._pending.values():
                    w.wait()
        self._pending = {}
        return time.perf_counter() - t0

    # -- the step ---------------------------------------------------------------------------------------

    def step(self, plan: StepPlan, mbs: List[MicroBatch], apply: bool = True) -> StepResult:
        """One training step on this rank's micro-batches of `plan` (every rank calls it, also one
        without items). `mbs` from microbatches() was checked there (check.py); any other list is
        checked here, so every rank must pass the same kind. apply=False stops after the gradients
        (summed over ranks, unclipped, in flat_grad / .grad); apply_update(result) then takes the
        optimizer step."""
        with guard.failing():  # this rank's error, recorded for the ranks waiting on it (guard.py)
            return self._step(plan, mbs, apply)

    def _step(self, plan: StepPlan, mbs: List[MicroBatch], apply: bool) -> StepResult:
        t0 = time.perf_counter()
        if getattr(mbs, "checked", None) is not plan:  # a list microbatches() did not check for this plan
            if self.par is not None:  # 3D: the plan's ranks are HDP ranks
                check_plan(plan, self.par.hdp_rank, hdp=self.par.hdp)
            else:
                check_plan(plan, dist.get_rank() if dist.is_initialized() else 0)
        self.flat_grad.zero_()
        self.ring_stats.reset()
        loss_sum, compute = self.forward_backward(plan, mbs)
        sync = self.sync()
        # the loss: every rank's sum of token losses over the batch's labelled tokens (in 3D, the last
        # stage's, the same on its tp ranks: counted by tp rank 0)
        counts = self.par is None or (self.par.last and self.par.tp_rank == 0)
        # the gradient norm: in 3D every part once (hdp rank 0), replicated norm gains on tp rank 0
        sq = 0.0
        if self.par is not None:
            if self.par.hdp_rank == 0:
                g2 = self.flat_grad.double().pow(2)
                if self.par.tp_rank != 0:
                    g2 = g2[~self.model.replicated().to(g2.device)]
                sq = float(g2.sum())
        total = torch.tensor([loss_sum if counts else 0.0, sq], dtype=torch.float64, device=self.flat_grad.device)
        if self.world > 1:
            with guard.waiting("the loss's all-reduce"):
                dist.all_reduce(total)
        loss = float(total[0].item()) / max(1, plan.labelled)
        if self.par is not None:
            norm = math.sqrt(float(total[1].item()))
        else:
            norm = math.sqrt(float(self.flat_grad.double().pow(2).sum()))
        scale = 1.0 if self.clip <= 0 or norm <= self.clip else self.clip / norm
        lr = lr_schedule(self.step_count, self.lr, self.min_lr, self.warmup, self.schedule_steps)
        result = StepResult(loss=loss, grad_norm=norm, clip_scale=scale, lr=lr, seconds=0.0, compute=compute,
                            wait=self.ring_stats.wait, sync=sync, items=len(mbs),
                            rings=sum(1 for m in mbs if m.ring is not None or m.ulysses is not None),
                            tokens=sum(m.T for m in mbs),
                            loss_sum=loss_sum)
        if apply:
            self.apply_update(result)
        result.seconds = time.perf_counter() - t0
        return result

    def apply_update(self, result: StepResult) -> None:
        """Clip by the global norm and take the AdamW step at the scheduled learning rate. A loss or
        gradient norm that is not finite stops here, before any weight changes."""
        if not (math.isfinite(result.loss) and math.isfinite(result.grad_norm)):
            raise FloatingPointError(f"step {self.step_count + 1}: loss {result.loss}, gradient norm "
                                     f"{result.grad_norm}: not finite; the update is not applied")
        if result.clip_scale != 1.0:
            self.flat_grad.mul_(result.clip_scale)
        for g in self.opt.param_groups:
            g["lr"] = result.lr
        self.opt.step()
        self.step_count += 1
