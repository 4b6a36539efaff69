"""3D layouts: HDP beside tensor parallelism (TP) and pipeline stages (PP), the C engine's layout
(src/runtime/parallel.c, docs/runtime.md "3D") on torch.distributed process groups.

    layout = Layout(tp=2, pp=2)               # after init_process_group; world = tp x pp x H
    model = Llama(cfg, layout=layout)         # this process's stage and tp share of the model
    mbs = microbatches(plan, layout.hdp_rank, source, layout=layout)   # the plan's ranks are HDP ranks

World rank = (stage x H + hdp) x T + tp: TP innermost (a tp group is T consecutive ranks, one node),
PP outermost. Three kinds of group, made ONCE by `Layout` with `new_group` (collective over the whole
world: every process calls it for every group, in the same order, member or not):

    tp    the T processes of one (stage, hdp)   the layers' all-reduces, the vocabulary-parallel loss
    hdp   the H processes of one (stage, tp)    rings and all-to-alls (plan rank h = HDP rank h), the
                                                gradient all-reduce / ZeRO-1 over identical parameters
    pipe  the P processes of one (hdp, tp)      activations forward, their gradients back (two groups
                                                per pipe, one per direction: neither waits on the other)

The order of the calls: every tp group (stage-major, then hdp), then every hdp group (stage-major,
then tp), then every pipe's forward group and backward group (hdp-major, then tp). A dimension of
size 1 makes no group (its collectives are no-ops); an hdp dimension that is the whole world uses the
default group.

Also here: Megatron's two conjugate functions (`copy_to_tp`: identity forward, all-reduce backward;
`reduce_from_tp`: all-reduce forward, identity backward), the column- and row-parallel linear layers
built from them, a vocabulary-parallel embedding and cross-entropy, and the C engine's split of the
layers over the stages.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import guard


def split_layers(n_layers: int, pp: int, layer_time: float = 1.0, head_time: float = 0.0) -> List[int]:
    """Stage boundaries [b_0 = 0, b_1, ..., b_pp = n_layers] as the C engine's pipeline_split_layers:
    every stage one layer, the last also the head (head_time), then each further layer to the stage
    quickest so far (ties to the earlier stage). layer_time / head_time: the cost model's times at the
    capacity (the C engine prints its split at start); the defaults split the layers evenly."""
    if not 1 <= pp <= n_layers:
        raise ValueError(f"--pp {pp}: a model of {n_layers} layers has at most {n_layers} pipeline stages "
                         f"(every stage needs a layer)")
    count = [1] * pp
    time = [layer_time + (head_time if s == pp - 1 else 0.0) for s in range(pp)]
    for _ in range(pp, n_layers):
        best = 0
        for s in range(1, pp):
            if time[s] < time[best] - 1e-12 * time[best]:
                best = s
        count[best] += 1
        time[best] += layer_time
    begin = [0]
    for c in count:
        begin.append(begin[-1] + c)
    return begin


class Layout:
    """This process's place in a (pp, hdp, tp) layout of the default group, and its process groups.

    tp, pp            tensor-parallel size and pipeline stages; hdp = world / (tp x pp)
    stage_begin       layer boundaries per stage (split_layers(n_layers, pp) or the C engine's); may be
                      None until a model needs it
    world, rank       of the default group (default: the initialised group's)

    Attributes: tp_rank, hdp_rank, stage; tp_group, hdp_group, pipe_fwd, pipe_bwd (None where that
    dimension is 1); first / last (stage).
    """

    def __init__(self, tp: int = 1, pp: int = 1, stage_begin: Optional[Sequence[int]] = None,
                 world: Optional[int] = None, rank: Optional[int] = None):
        if world is None:
            world = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if tp < 1 or pp < 1:
            raise ValueError(f"tp {tp}, pp {pp}: both must be >= 1")
        if world % (tp * pp) != 0:
            raise ValueError(f"{world} processes do not divide into tp {tp} x pp {pp} = {tp * pp}: run "
                             f"N = tp x pp x H processes (H HDP ranks)")
        self.tp, self.pp, self.hdp = tp, pp, world // (tp * pp)
        self.world, self.rank = world, rank
        self.tp_rank = rank % tp
        self.hdp_rank = rank // tp % self.hdp
        self.stage = rank // (tp * self.hdp)
        self.first, self.last = self.stage == 0, self.stage == pp - 1
        self.stage_begin = list(stage_begin) if stage_begin is not None else None
        if self.stage_begin is not None and len(self.stage_begin) != pp + 1:
            raise ValueError(f"stage_begin has {len(self.stage_begin)} boundaries for {pp} stages (need {pp + 1})")
        self.tp_group = self.hdp_group = self.pipe_fwd = self.pipe_bwd = None
        if world > 1 and dist.is_initialized():  # (without a process group: the arithmetic only)
            self._make_groups()

    def _make_groups(self) -> None:
        # torch's new_group is collective over the whole world: every process makes every group, in
        # one order, and keeps its own
        T, H, P = self.tp, self.hdp, self.pp
        if T > 1:
            for s in range(P):
                for h in range(H):
                    g = dist.new_group([self.world_rank(s, h, t) for t in range(T)])
                    if (s, h) == (self.stage, self.hdp_rank):
                        self.tp_group = g
        if H > 1 and H < self.world:
            for s in range(P):
                for t in range(T):
                    g = dist.new_group([self.world_rank(s, h, t) for h in range(H)])
                    if (s, t) == (self.stage, self.tp_rank):
                        self.hdp_group = g
        if P > 1:
            for h in range(H):
                for t in range(T):
                    members = [self.world_rank(s, h, t) for s in range(P)]
                    fwd, bwd = dist.new_group(members), dist.new_group(members)
                    if (h, t) == (self.hdp_rank, self.tp_rank):
                        self.pipe_fwd, self.pipe_bwd = fwd, bwd

    def world_rank(self, stage: int, hdp: int, tp: int) -> int:
        """The default group's rank of (stage, hdp, tp) (parallel_world_rank)."""
        return (stage * self.hdp + hdp) * self.tp + tp

    def hdp_to_world(self, hdp_ranks: Sequence[int]) -> List[int]:
        """The default group's ranks of HDP ranks at this process's stage and tp rank: a plan item's
        members as this process's ring peers."""
        return [self.world_rank(self.stage, int(h), self.tp_rank) for h in hdp_ranks]

    def stage_layers(self, n_layers: int) -> range:
        """The layers this process's stage holds."""
        if self.stage_begin is None:
            self.stage_begin = split_layers(n_layers, self.pp)
        if self.stage_begin[0] != 0 or self.stage_begin[-1] != n_layers or any(
                a >= b for a, b in zip(self.stage_begin, self.stage_begin[1:])):
            raise ValueError(f"stage_begin {self.stage_begin}: increasing from 0 to the model's {n_layers} layers, "
                             f"every stage at least one")
        return range(self.stage_begin[self.stage], self.stage_begin[self.stage + 1])

    def __repr__(self):
        return (f"Layout(tp={self.tp}, pp={self.pp}, hdp={self.hdp}; rank {self.rank} = stage {self.stage}, "
                f"hdp {self.hdp_rank}, tp {self.tp_rank})")


# ---- Megatron's conjugate functions over the tp group -------------------------------------------------

def _all_reduce(x: Tensor, group, op=dist.ReduceOp.SUM) -> Tensor:
    x = x.contiguous().clone()
    if x.numel() > 0:
        with guard.waiting("a tensor-parallel all-reduce"):  # a tp peer that failed is named (guard.py)
            dist.all_reduce(x, op=op, group=group)
    return x


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the tp group (the input of a column-parallel
    layer is replicated, each rank's part of its gradient comes from its own columns)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Sum over the tp group forward (a row-parallel layer's partial outputs); identity backward (the
    output's gradient is replicated, each rank's part needs all of it)."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def copy_to_tp(x: Tensor, group) -> Tensor:
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: Tensor, group) -> Tensor:
    return x if group is None else _ReduceFromTP.apply(x, group)


class _ColumnParallel(torch.autograd.Function):
    """y_i = x @ W_i^T for column-parallel weights that share the replicated input x. Backward: the
    input's gradient sum_i dy_i @ W_i is this rank's part; its sum over the tp group is STARTED, the
    weight gradients dy_i^T @ x computed meanwhile, and the sum waited for after them (Megatron's
    overlap, the C engine's column_backward): the weight gradients never read the sum."""

    @staticmethod
    def forward(ctx, x, group, *ws):
        ctx.group = group
        ctx.save_for_backward(x, *ws)
        return tuple(x @ w.t() for w in ws)

    @staticmethod
    def backward(ctx, *dys):
        x, *ws = ctx.saved_tensors
        dys = [dy if dy is not None else x.new_zeros(x.shape[0], w.shape[0]) for dy, w in zip(dys, ws)]
        dx = dys[0] @ ws[0]
        for dy, w in zip(dys[1:], ws[1:]):
            dx = dx + dy @ w
        work = dist.all_reduce(dx, group=ctx.group, async_op=True) if dx.numel() > 0 else None
        dws = [dy.t() @ x for dy in dys]
        if work is not None:
            with guard.waiting("a tensor-parallel all-reduce"):
                work.wait()
        return (dx, None, *dws)


def column_parallel_group(x: Tensor, ws: Sequence[Tensor], group) -> List[Tensor]:
    """x (T, in) replicated, ws[i] (out_i/T, in) this rank's rows of column-parallel weights that
    share the input (wq, wk, wv; w_gate, w_up): this rank's columns of each x @ W_i^T. The input's
    gradient is summed over the group once, behind the weight gradients."""
    if group is None:
        return [x @ w.t() for w in ws]
    return list(_ColumnParallel.apply(x, group, *ws))


def column_parallel(x: Tensor, w: Tensor, group) -> Tensor:
    """x (T, in) replicated, w (out/T, in) this rank's rows: this rank's columns of x @ W^T."""
    return column_parallel_group(x, [w], group)[0]


def row_parallel(x: Tensor, w: Tensor, group) -> Tensor:
    """x (T, in/T) this rank's columns of the input, w (out, in/T): x @ W^T summed over the group."""
    return reduce_from_tp(x @ w.t(), group)


def _part(n: int, tp: int, r: int, what: str) -> range:
    if n % tp:
        raise ValueError(f"tensor parallelism {tp} does not divide {what} {n}")
    return range(r * n // tp, (r + 1) * n // tp)


def _full_init(out_features: int, in_features: int, bias: bool, seed: Optional[int], dtype, device):
    """The whole layer's (weight, bias) as nn.Linear(in_features, out_features) initialises them:
    kaiming-uniform weight (a = sqrt(5), bound 1 / sqrt(in)), uniform bias in +-1 / sqrt(in), drawn in
    that order from torch.Generator().manual_seed(seed), or from the default generator when seed is
    None (then every tp rank must be seeded alike, and the draws are nn.Linear's own)."""
    import math
    gen = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    # drawn on the CPU in the layer's dtype, as nn.Linear(..., dtype=) on the CPU draws them
    w = torch.empty(out_features, in_features, dtype=dtype)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=gen)
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
        b = torch.empty(out_features, dtype=dtype)
        nn.init.uniform_(b, -bound, bound, generator=gen)
    return w.to(device=device), (b.to(device=device) if b is not None else None)


def _given(t: Tensor, shape, what: str) -> Tensor:
    t = torch.as_tensor(t)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(t.shape)}, the whole layer's is {tuple(shape)}")
    return t


def _mark(p: nn.Parameter, dim: Optional[int], full_shape, start: int, layout: "Layout") -> nn.Parameter:
    """Note on a parameter how it lies in the whole layer: split along `dim` (None: replicated on every
    tp rank) from `start`, of `full_shape`. clip_grad_norm_ and the TP checkpoints (tp_checkpoint.py)
    read it."""
    p.tp_dim, p.tp_full_shape, p.tp_start, p.tp_layout = dim, tuple(full_shape), int(start), layout
    return p


class _TPLinear(nn.Module):
    """What the two layers share: the whole layer's init (a seed, the default generator, or the
    user's whole weight and bias), sliced to this rank's part."""

    def _params(self, in_features: int, out_features: int, layout: "Layout", split_dim: int, bias, weight,
                seed, dtype, device):
        self.in_features, self.out_features = in_features, out_features
        self.layout, self.group = layout, layout.tp_group
        given_bias = bias if isinstance(bias, Tensor) else None
        has_bias = given_bias is not None or bool(bias)
        if weight is None:
            w, b = _full_init(out_features, in_features, has_bias, seed, dtype, device)
        else:
            w, b = _given(weight, (out_features, in_features), "weight").to(dtype=dtype, device=device), None
            if has_bias and given_bias is None:
                b = torch.zeros(out_features, dtype=dtype, device=device)
        if given_bias is not None:
            b = _given(given_bias, (out_features,), "bias").to(dtype=dtype, device=device)
        part = self.rows if split_dim == 0 else self.cols
        local = w[part.start:part.stop] if split_dim == 0 else w[:, part.start:part.stop]
        self.weight = _mark(nn.Parameter(local.contiguous().clone()), split_dim, w.shape, part.start, layout)
        self.bias = None
        if b is not None:
            if split_dim == 0:  # a column-parallel bias is split with the output rows
                self.bias = _mark(nn.Parameter(b[part.start:part.stop].clone()), 0, b.shape, part.start, layout)
            else:  # a row-parallel bias is added once, after the sum: whole on every rank
                self.bias = _mark(nn.Parameter(b.clone()), None, b.shape, 0, layout)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"tp={self.layout.tp}, tp_rank={self.layout.tp_rank}")


class ColumnParallelLinear(_TPLinear):
    """y = x @ W^T + b, W (out, in) and b (out,) split by output rows over the layout's tp group: rank
    r holds rows [r out/T, (r+1) out/T) and returns its columns of y (T = layout.tp). The input x is
    whole on every tp rank; the backward sums its gradient over the group, overlapped with the
    weight's gradient (column_parallel_group).

    Initialisation, the same whole layer on every tp rank, each keeping its rows:
      weight=None (default)   nn.Linear's: from torch.Generator().manual_seed(seed), or with seed=None
                              from the default generator exactly as nn.Linear(in, out) draws it (seed
                              every rank alike: torch.manual_seed)
      weight=W                the whole (out, in) weight given; bias=True then starts at zero, or
                              bias=B the whole (out,) bias
    bias=False: no bias. The parameters carry tp_dim (0), tp_full_shape and tp_start for
    clip_grad_norm_ and save_tp / load_tp."""

    def __init__(self, in_features: int, out_features: int, layout: "Layout", bias=True, *,
                 weight: Optional[Tensor] = None, seed: Optional[int] = None, dtype=torch.float32, device=None):
        super().__init__()
        self.rows = _part(out_features, layout.tp, layout.tp_rank, "out_features")
        self._params(in_features, out_features, layout, 0, bias, weight, seed, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        y = column_parallel(x, self.weight, self.group)
        return y if self.bias is None else y + self.bias


class RowParallelLinear(_TPLinear):
    """y = x @ W^T + b, W (out, in) split by input columns over the layout's tp group: rank r holds
    columns [r in/T, (r+1) in/T) and takes its columns of x (a column-parallel layer's output); the
    partial products are summed over the group forward, then b (whole on every rank, added once) is
    added; the replicated output gradient needs nothing backward. Initialisation and bias as
    ColumnParallelLinear's (the weight's columns kept; tp_dim 1, the bias's tp_dim None)."""

    def __init__(self, in_features: int, out_features: int, layout: "Layout", bias=True, *,
                 weight: Optional[Tensor] = None, seed: Optional[int] = None, dtype=torch.float32, device=None):
        super().__init__()
        self.cols = _part(in_features, layout.tp, layout.tp_rank, "in_features")
        self._params(in_features, out_features, layout, 1, bias, weight, seed, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        y = row_parallel(x, self.weight, self.group)
        return y if self.bias is None else y + self.bias


def vocab_embedding(tokens: Tensor, w: Tensor, v0: int, group) -> Tensor:
    """Rows of the embedding split by vocabulary: w (V/T, D) holds tokens [v0, v0 + V/T); the rows of
    other ranks' tokens are zero here and the sum over the group gives every row."""
    if group is None:
        return torch.nn.functional.embedding(tokens, w)
    mine = (tokens >= v0) & (tokens < v0 + w.shape[0])
    e = torch.nn.functional.embedding(torch.where(mine, tokens - v0, torch.zeros_like(tokens)), w)
    return reduce_from_tp(e * mine.unsqueeze(1).to(e.dtype), group)


class _VocabParallelCE(torch.autograd.Function):
    """Per-row cross-entropy of logits split by vocabulary (this rank's columns [v0, v0 + V/T)): the row
    max, the sum of exponentials and the target's logit reduced over the group, never the whole
    logits (the C engine's fused head). Rows with target -1 give 0."""

    @staticmethod
    def forward(ctx, logits, targets, v0, group):
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        z = logits.to(acc)
        m = _all_reduce(z.max(-1).values, group, dist.ReduceOp.MAX)
        e = torch.exp(z - m[:, None])
        s = _all_reduce(e.sum(-1), group)
        local = targets - v0
        mine = (targets >= 0) & (local >= 0) & (local < z.shape[1])
        idx = torch.where(mine, local, torch.zeros_like(local))
        t = torch.where(mine, z.gather(1, idx[:, None])[:, 0], torch.zeros_like(m))
        t = _all_reduce(t, group)
        valid = targets >= 0
        loss = torch.where(valid, torch.log(s) + m - t, torch.zeros_like(m))
        ctx.save_for_backward(e / s[:, None], idx, mine, valid)
        return loss.to(logits.dtype)

    @staticmethod
    def backward(ctx, g):
        p, idx, mine, valid = ctx.saved_tensors
        d = p.clone()
        rows = torch.nonzero(mine)[:, 0]
        d[rows, idx[rows]] -= 1
        d = d * (g.to(d.dtype) * valid.to(d.dtype))[:, None]
        return d.to(g.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, v0: int, group) -> Tensor:
    """Per-row token losses (T,) of logits (T, V/T) holding vocabulary [v0, v0 + V/T) on each rank."""
    return _VocabParallelCE.apply(logits, targets, v0, group)


def tp_part(n: int, tp: int, r: int, what: str) -> range:
    """Rank r's contiguous 1/tp of n (heads, columns, vocabulary rows); refuses a tp that does not divide."""
    return _part(n, tp, r, what)



def gather_whole(model, local: Tensor, dst: int = 0):
    """The whole model's flat vector (fp32 or the local dtype, on the CPU) assembled on world rank
    `dst` from every part's `local` (a vector in the part's flat layout: its parameters, gradients or
    an optimizer moment), through each part's full_index; HDP rank 0 of every part sends its copy.
    Every process calls it; `dst` gets the vector, the others None. With the whole model (no layout)
    it returns `local` itself on every process. What a checkpoint of a 3D job needs (the C engine's
    world rank 0 gathers the same way, docs/runtime.md "Optimizer and checkpoints")."""
    lay = model.parallel
    if lay is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return local.detach().cpu()
    mine = (model.full_index(), local.detach().cpu()) if lay.hdp_rank == 0 else None
    parts = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    if dist.get_backend() == "nccl":
        # gather_object needs the current device's id on NCCL; all_gather_object is simpler to get right
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        parts = everyone if dist.get_rank() == dst else None
    else:
        dist.gather_object(mine, parts, dst=dst)
    if parts is None:
        return None
    whole = torch.full((model.cfg.n_params,), float("nan"), dtype=local.dtype)
    for p in parts:
        if p is not None:
            whole[p[0]] = p[1]
    if torch.isnan(whole).any():
        raise RuntimeError("gather_whole: the parts do not cover the whole model (every stage and tp rank "
                           "of the layout must hold a part)")
    return whole
