"""A reference LLaMA in plain torch: the C engine's architecture (docs/model.md), with HDP attention.

    x = tok_emb[tokens]
    for each layer:
        n = rmsnorm(x) * attn_norm
        q, k, v = n @ wq^T (T, H, hd), n @ wk^T, n @ wv^T (T, G, hd)
        q, k = rope(q, pos), rope(k, pos)           pairs (2i, 2i+1) rotated by pos * theta^(-2i/hd)
        x = x + attention(q, k, v) @ wo^T           causal within a segment, GQA
        n = rmsnorm(x) * mlp_norm
        x = x + (silu(n @ w_gate^T) * (n @ w_up^T)) @ w_down^T
    logits = (rmsnorm(x) * final_norm) @ lm_head^T  untied head; loss = sum of token cross-entropies

No biases; RMSNorm y = x / sqrt(mean(x^2) + eps) * w; RoPE angles in double from each token's global
position. Every parameter is a view into ONE flat fp32 vector `model.flat`, in the C engine's order
and names (tok_emb, layers.<l>.{attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down},
final_norm, lm_head; weights stored (out, in)), so a checkpoint's `params` section loads with one
copy and the gradient all-reduce runs on contiguous buckets.

Attention goes through `HDPAttention` (or the functional `hdp_attention`): it reads the micro-batch
the executor is running (`microbatch_context`) and calls varlen attention for a pack or ring
attention for a ring member, so the model itself knows nothing about plans; outside a micro-batch
it is plain causal attention on this rank (eval, generation with the model being trained).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import guard
from .attention import Rows, local_attention, varlen_attention
from .compiling import not_traced
from .parallel import (column_parallel_group, copy_to_tp, row_parallel, tp_part, vocab_embedding,
                       vocab_parallel_cross_entropy)
from .ring import ring_attention
from .shapes import ShapeError
from .ulysses import ulysses_attention


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A dense LLaMA-style shape (include/bytescale/model.h ModelConfig, without the MoE fields)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    head_dim: int
    d_ff: int
    vocab_size: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    name: str = ""

    # the C catalogue's byte-vocabulary models (src/core/model.c), the ones `bytescale train` trains
    CATALOGUE = {
        "tiny": (2, 4, 2, 64, 16, 192, 256, 10000.0, 1e-5),
        "small": (4, 4, 2, 256, 64, 704, 256, 10000.0, 1e-5),
        "base": (8, 8, 2, 512, 64, 1408, 256, 10000.0, 1e-5),
    }

    @classmethod
    def named(cls, name: str) -> "LlamaConfig":
        """tiny, small or base (the models `bytescale train --model` takes)."""
        if name not in cls.CATALOGUE:
            raise ValueError(f"model {name!r}: one of {', '.join(cls.CATALOGUE)}")
        return cls(*cls.CATALOGUE[name], name=name)

    @classmethod
    def for_dataset(cls, name: str, ds, tp: int = 1) -> "LlamaConfig":
        """Model `name` with the vocabulary of dataset `ds` (a Dataset: its tokenizer's highest id + 1),
        rounded up to a multiple of tp: what `bytescale train` does (docs/training.md, "The
        vocabulary"). Raises ValueError when a token of the dataset is outside it (a damaged shard)."""
        vocab = -(-int(ds.vocab) // tp) * tp
        top = ds.max_token() if hasattr(ds, "max_token") else -1
        if top >= vocab:
            raise ValueError(f"{getattr(ds, 'path', 'dataset')}: token id {top} outside its vocabulary of {ds.vocab}")
        return dataclasses.replace(cls.named(name), vocab_size=vocab)

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """From a checkpoint's config["model"] object (docs/training.md)."""
        if int(d.get("n_experts", 1)) != 1:
            raise ValueError("only dense models (n_experts 1) are supported")
        return cls(int(d["n_layers"]), int(d["n_heads"]), int(d["n_kv_heads"]), int(d["d_model"]),
                   int(d["head_dim"]), int(d["d_ff"]), int(d["vocab_size"]), float(d["rope_theta"]),
                   float(d["norm_eps"]), str(d.get("name", "")))

    def tensors(self) -> List[Tuple[str, Tuple[int, ...], bool]]:
        """[(name, shape, decays)] in the flat layout's order (docs/model.md, "Parameter layout")."""
        D, H, G, hd, F_, V = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.d_ff, self.vocab_size
        out = [("tok_emb", (V, D), True)]
        for l in range(self.n_layers):
            p = f"layers.{l}."
            out += [(p + "attn_norm", (D,), False), (p + "wq", (H * hd, D), True), (p + "wk", (G * hd, D), True),
                    (p + "wv", (G * hd, D), True), (p + "wo", (D, H * hd), True), (p + "mlp_norm", (D,), False),
                    (p + "w_gate", (F_, D), True), (p + "w_up", (F_, D), True), (p + "w_down", (D, F_), True)]
        out += [("final_norm", (D,), False), ("lm_head", (V, D), True)]
        return out

    @property
    def n_params(self) -> int:
        return sum(math.prod(s) for _, s, _ in self.tensors())


# ---- the micro-batch the executor is running, for HDPAttention -------------------------------------

class _Current(threading.local):
    attention: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None
    mb: object = None


_current = _Current()


@contextlib.contextmanager
def microbatch_context(mb) -> Iterator[None]:
    """Within the block, HDPAttention / hdp_attention attend as micro-batch `mb` needs: ring attention
    over mb.ring for a ring member, Ulysses attention (all-to-all of heads, and for a hybrid item a
    ring across the groups) over mb.ulysses, blockwise per-segment causal attention over mb's own
    rows for a pack. `mb` is a bytescale.torch.MicroBatch (or anything with `rows` and `ring`)."""
    prev, prev_mb = _current.attention, _current.mb
    rows, ring, group = mb.rows, mb.ring, getattr(mb, "ulysses", None)
    if group is not None:
        _current.attention = lambda q, k, v: ulysses_attention(q, k, v, group)
    elif ring is not None:
        _current.attention = lambda q, k, v: ring_attention(q, k, v, ring)
    else:
        _current.attention = lambda q, k, v: local_attention(q, k, v, rows, None)
    _current.mb = mb
    try:
        with guard.failing():  # this rank's error, recorded for the peers waiting on it (guard.py)
            yield
    finally:
        _current.attention, _current.mb = prev, prev_mb


def current_microbatch():
    """The micro-batch whose `microbatch_context` this thread is in, or None outside one (where
    hdp_attention runs plain causal attention on this rank: eval, generation)."""
    return _current.mb


def item_rows(mb) -> List[Rows]:
    """Every member's Rows of mb's item (the pack's own rows for a pack): what the whole item
    attends over, the same list on every member (so a check on it fails on all of them alike)."""
    if getattr(mb, "ulysses", None) is not None:
        u = mb.ulysses
        return list(u.ring.rows) if u.ring is not None else [u.rows]
    if mb.ring is not None:
        return list(mb.ring.rows)
    return [mb.rows]


def _plain_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], what: str) -> Tensor:
    """Causal attention of the rows q (T, H, hd), k, v (T, G, hd) on this rank, no message: one
    sequence, or the documents cu_seqlens [0, l0, l0+l1, ..., T] packs (each attending to itself)."""
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, q.shape[0]], dtype=torch.int64)
    try:
        return varlen_attention(q, k, v, cu_seqlens)
    except ShapeError as e:
        raise ShapeError(f"{e} ({what}, outside a micro-batch)") from None


@not_traced  # torch.compile breaks its graph here, cleanly (compiling.py, docs/torch-precision.md)
def hdp_attention(q: Tensor, k: Tensor, v: Tensor, layout: str = "thd", cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """The attention of the micro-batch being run (inside `microbatch_context`): the one-line
    replacement for a model's attention call.

    layout "thd": q (T, H, hd), k and v (T, G, hd), returns (T, H, hd);
    layout "bhsd": q (1, H, T, hd), k and v (1, G, T, hd) (the layout of
    F.scaled_dot_product_attention), returns (1, H, T, hd).
    q and k must already carry RoPE at the micro-batch's positions (MicroBatch.pos).

    Outside a micro-batch (eval, generation without a KV cache) it is plain causal attention on this
    rank, no message: thd rows are one sequence, or the documents `cu_seqlens` packs ([0, l0,
    l0+l1, ..., T], each attending to itself only); bhsd (B, H, S, hd) is B sequences of S rows each
    (no padding: pad with a model's own attention and its mask), or with cu_seqlens one row (B = 1)
    of packed documents. Inside a micro-batch the plan's rows say where documents start, and
    cu_seqlens is refused (it would say something else)."""
    if layout not in ("thd", "bhsd"):
        raise ValueError(f"layout {layout!r}: 'thd' or 'bhsd'")
    fn = _current.attention
    if fn is None:
        return _outside(q, k, v, layout, cu_seqlens)
    if cu_seqlens is not None:
        raise ValueError("hdp_attention: cu_seqlens inside a micro-batch: the micro-batch's rows (mb.pos, mb.seg) "
                         "say where its documents start; pass cu_seqlens outside a micro-batch only")
    if layout == "thd":
        return fn(q, k, v)
    given = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or (q.shape[0], k.shape[0], v.shape[0]) != (1, 1, 1):
        raise ShapeError(f"layout bhsd: q (1, H, T, hd), k and v (1, G, T, hd) (an HDP micro-batch is one packed "
                         f"row: batch size 1); got {given}")
    try:
        out = fn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1))
    except ShapeError as e:  # the kernels name (rows, heads, head_dim): say what was passed
        raise ShapeError(f"{e} (layout bhsd: shapes above as (T, heads, hd); got {given})") from None
    return out.transpose(0, 1).unsqueeze(0)


def _outside(q: Tensor, k: Tensor, v: Tensor, layout: str, cu_seqlens: Optional[Tensor]) -> Tensor:
    """hdp_attention outside a micro-batch (its docstring): plain causal attention on this rank."""
    if layout == "thd":
        return _plain_attention(q, k, v, cu_seqlens, "layout thd")
    given = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ShapeError(f"layout bhsd: q (B, H, S, hd), k and v (B, G, S, hd); got {given}")
    B, S = q.shape[0], q.shape[2]
    if cu_seqlens is not None and B != 1:
        raise ShapeError(f"layout bhsd with cu_seqlens: one packed row (B = 1); got {given}")
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, B * S + 1, max(S, 1), dtype=torch.int64)[:B + 1] if S else torch.zeros(
            B + 1, dtype=torch.int64)
    flat = lambda x: x.transpose(1, 2).reshape(B * x.shape[2], x.shape[1], x.shape[3])
    out = _plain_attention(flat(q), flat(k), flat(v), cu_seqlens, f"layout bhsd; got {given}")
    return out.view(B, S, q.shape[1], q.shape[3]).transpose(1, 2)


class HDPAttention(nn.Module):
    """An attention module that attends as the running micro-batch needs (see hdp_attention); put it
    where a model calls its attention kernel. Outside a micro-batch: plain causal attention of the
    rows (hdp_attention's docstring), so the same model evaluates and generates on one rank."""

    def __init__(self, layout: str = "thd"):
        super().__init__()
        self.layout = layout

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return hdp_attention(q, k, v, self.layout)


# ---- the model ----------------------------------------------------------------------------------------

def rope_tables(pos: Tensor, head_dim: int, theta: float, dtype: torch.dtype, device) -> Tuple[Tensor, Tensor]:
    """cos, sin (T, head_dim/2) for global positions, computed in double as the C engine does (a
    position of 10^6 in fp32 would be off by hundredths of a radian), then cast. On pos's device (no
    copy to the host per micro-batch), except where that device has no double (MPS)."""
    at = pos.device if pos.device.type != "mps" else torch.device("cpu")
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=at)
    freq = torch.pow(torch.tensor(theta, dtype=torch.float64, device=at), -2.0 * i / head_dim)
    a = pos.to(at, torch.float64)[:, None] * freq[None, :]
    return torch.cos(a).to(device, dtype), torch.sin(a).to(device, dtype)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate every pair (2i, 2i+1) of every head of x (T, heads, hd) by the row's angle i."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def rmsnorm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class _Boundary(torch.autograd.Function):
    """Identity whose backward calls `hook(bucket)`: placed at a layer's input, its backward runs
    once the layer's backward is done (its parameters' gradient accumulations, which autograd runs
    first whenever they are ready, included), so the gradient all-reduce of that bucket can start
    while the layers below still compute."""

    @staticmethod
    def forward(ctx, x, hook, bucket):
        ctx.hook, ctx.bucket = hook, bucket
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.hook(ctx.bucket)
        return g, None, None


class Llama(nn.Module):
    """The reference LLaMA (module docstring). `attention` replaces the attention call (default:
    hdp_attention, which needs a microbatch_context); `dtype` the parameters' (fp32 as the C engine,
    or fp64 for exactness tests).

    `parallel` (a parallel.Layout): this process's part of the model in a 3D layout, as the C
    engine's LlamaShard (docs/model.md, "Sharding"): its stage's layers (the first stage also the
    embedding, the last the final norm and the head) and of those its tp rank's share, Megatron-style:
    query and K/V heads (wq, wk, wv by rows, wo by columns), the MLP (w_gate, w_up by rows, w_down by
    columns), the vocabulary (tok_emb and lm_head by rows, a vocabulary-parallel cross-entropy); norm
    gains replicated. Names stay the whole model's (layers.<l>.wq with the global l); `full_index()`
    says where every local parameter lies in the whole model's flat vector."""

    def __init__(self, cfg: LlamaConfig, attention: Optional[nn.Module] = None, dtype: torch.dtype = torch.float32,
                 device=None, parallel=None):
        super().__init__()
        self.cfg = cfg
        self.attention = attention if attention is not None else HDPAttention()
        self.parallel = parallel
        tp, r = (parallel.tp, parallel.tp_rank) if parallel is not None else (1, 0)
        self.tp_group = parallel.tp_group if parallel is not None else None
        self.layers = parallel.stage_layers(cfg.n_layers) if parallel is not None else range(cfg.n_layers)
        self.first, self.last = self.layers[0] == 0, self.layers[-1] == cfg.n_layers - 1
        # this rank's heads, MLP columns and vocabulary rows (contiguous 1/tp of each)
        heads = tp_part(cfg.n_heads, tp, r, "n_heads")
        kv = tp_part(cfg.n_kv_heads, tp, r, "n_kv_heads")
        ff = tp_part(cfg.d_ff, tp, r, "d_ff")
        vocab = tp_part(cfg.vocab_size, tp, r, "vocab_size")
        self.n_heads, self.n_kv_heads, self.v0 = len(heads), len(kv), vocab.start
        hd = cfg.head_dim
        q_rows = range(heads.start * hd, heads.stop * hd)
        kv_rows = range(kv.start * hd, kv.stop * hd)
        # (name, whole shape, "rows" / "cols" / "all", the range of rows or columns held)
        cut = {"tok_emb": ("rows", vocab), "lm_head": ("rows", vocab), "wq": ("rows", q_rows),
               "wk": ("rows", kv_rows), "wv": ("rows", kv_rows), "wo": ("cols", q_rows), "w_gate": ("rows", ff),
               "w_up": ("rows", ff), "w_down": ("cols", ff)}
        self.layout = []  # (name, offset, local shape, decays)
        self._cut = {}  # name -> (offset in the whole flat vector, whole shape, kind, range)
        at = full = 0
        for name, shape, decay in cfg.tensors():
            short = name.split(".")[-1]
            layer = int(name.split(".")[1]) if name.startswith("layers.") else None
            held = (layer in self.layers) if layer is not None else (
                self.first if name == "tok_emb" else self.last)
            kind, rng = cut.get(short, ("all", None))
            if held:
                local = shape if kind == "all" else ((len(rng), shape[1]) if kind == "rows" else (shape[0], len(rng)))
                self.layout.append((name, at, local, decay))
                self._cut[name] = (full, shape, kind, rng)
                at += math.prod(local)
            full += math.prod(shape)
        self.flat = torch.zeros(at, dtype=dtype, device=device)
        # every parameter is a view into self.flat: nn.Parameter shares the storage it is given
        self._params: Dict[str, nn.Parameter] = {}
        for name, off, shape, _ in self.layout:
            p = nn.Parameter(self.flat[off:off + math.prod(shape)].view(shape))
            self._params[name] = p
            self.register_parameter(name.replace(".", "_"), p)
        self.grad_hook: Optional[Callable[[int], None]] = None  # set by the trainer (gradient buckets)

    def full_index(self) -> Tensor:
        """(len(flat),) int64: where each local parameter lies in the whole model's flat vector (the
        C engine's llama_shard_runs, element by element): whole[full_index()] is this part."""
        out = []
        for name, _, _, _ in self.layout:
            full, shape, kind, rng = self._cut[name]
            if kind == "all":
                out.append(torch.arange(full, full + math.prod(shape)))
            elif kind == "rows":
                out.append(torch.arange(full + rng.start * shape[1], full + rng.stop * shape[1]))
            else:
                cols = torch.arange(rng.start, rng.stop)
                out.append((full + torch.arange(shape[0])[:, None] * shape[1] + cols[None, :]).reshape(-1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def replicated(self) -> Tensor:
        """(len(flat),) bool: parameters every tp rank holds whole (the norm gains when tp > 1): the
        global gradient norm counts them on tp rank 0 only."""
        mask = torch.zeros(self.flat.numel(), dtype=torch.bool)
        if self.tp_group is not None:
            for name, off, shape, _ in self.layout:
                if self._cut[name][2] == "all":
                    mask[off:off + math.prod(shape)] = True
        return mask

    # -- parameters ------------------------------------------------------------------------------------

    def param(self, name: str) -> nn.Parameter:
        """A parameter by its C name (tok_emb, layers.0.wq, ...)."""
        return self._params[name]

    def named_flat_parameters(self) -> List[Tuple[str, nn.Parameter]]:
        """(C name, parameter) in the flat layout's order."""
        return [(name, self._params[name]) for name, _, _, _ in self.layout]

    def buckets(self) -> List[Tuple[int, int]]:
        """Flat ranges of the gradient buckets, in the order the backward finishes them: the head
        (final_norm, lm_head), then layers L-1 .. 0, then the embedding (the C engine's buckets; a
        stage's shard has the ones it holds)."""
        off = {name: (o, o + math.prod(s)) for name, o, s, _ in self.layout}
        out = [(off["final_norm"][0], off["lm_head"][1])] if self.last else []
        for l in reversed(self.layers):
            out.append((off[f"layers.{l}.attn_norm"][0], off[f"layers.{l}.w_down"][1]))
        if self.first:
            out.append(off["tok_emb"])
        return out

    def init_weights(self, seed: int = 0) -> "Llama":
        """normal(0, 0.02) matrices; wo and w_down 0.02 / sqrt(2 n_layers) (GPT-2); norm gains 1. The
        same scheme as the C engine, not the same numbers (its generator is counter-based, rng.h):
        load a checkpoint for identical weights."""
        g = torch.Generator().manual_seed(seed)
        small = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            # every whole tensor is drawn in order (a part of the model gets the whole model's numbers)
            for name, shape, _ in self.cfg.tensors():
                if len(shape) == 1:
                    if name in self._params:
                        self._params[name].fill_(1.0)
                    continue
                std = small if name.endswith(".wo") or name.endswith(".w_down") else 0.02
                w = torch.randn(shape, generator=g, dtype=torch.float64)
                if name in self._params:
                    self._params[name].copy_(self._local(name, w).to(self.flat.dtype) * std)
        return self

    def _local(self, name: str, whole: Tensor) -> Tensor:
        """This part's piece of a whole tensor `name`."""
        _, _, kind, rng = self._cut[name]
        if kind == "rows":
            return whole[rng.start:rng.stop]
        if kind == "cols":
            return whole[:, rng.start:rng.stop]
        return whole

    # -- forward ---------------------------------------------------------------------------------------

    def _mark(self, x: Tensor, bucket: int) -> Tensor:
        return _Boundary.apply(x, self.grad_hook, bucket) if self.grad_hook is not None and x.requires_grad else x

    def hidden(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """The final normalised hidden states (T, d_model) of one micro-batch's rows (tokens (T,),
        global positions (T,)); attention through self.attention. The whole model's stages only."""
        return self.stage_forward(tokens, pos)

    def stage_forward(self, tokens: Tensor, pos: Tensor, x: Optional[Tensor] = None) -> Tensor:
        """This stage's layers on one micro-batch: from the tokens (the first stage) or from the
        previous stage's output x (T, d_model); returns the next stage's input, or on the last stage
        the final normalised hidden states. Under tp every rank of the group returns the same."""
        c = self.cfg
        P = self._params
        g = self.tp_group
        T = pos.shape[0]
        if self.first:
            x = vocab_embedding(tokens, P["tok_emb"], self.v0, g)
        cos, sin = rope_tables(pos, c.head_dim, c.rope_theta, x.dtype, x.device)
        nb = len(self.layers) + (1 if self.last else 0)
        for l in self.layers:
            p = f"layers.{l}."
            # the bucket of layer l (buckets()): its backward is done when this input's gradient is
            x = self._mark(x, nb - 1 - (l - self.layers[0]))
            # column parallel: one sum of dn for wq, wk, wv, behind their weight gradients
            n = rmsnorm(x, P[p + "attn_norm"], c.norm_eps)
            q, k, v = column_parallel_group(n, [P[p + "wq"], P[p + "wk"], P[p + "wv"]], g)
            q = q.view(T, self.n_heads, c.head_dim)
            k = k.view(T, self.n_kv_heads, c.head_dim)
            v = v.view(T, self.n_kv_heads, c.head_dim)
            a = self.attention(rope(q, cos, sin), rope(k, cos, sin), v)
            x = x + row_parallel(a.reshape(T, self.n_heads * c.head_dim), P[p + "wo"], g)
            n = rmsnorm(x, P[p + "mlp_norm"], c.norm_eps)
            gate, up = column_parallel_group(n, [P[p + "w_gate"], P[p + "w_up"]], g)
            x = x + row_parallel(F.silu(gate) * up, P[p + "w_down"], g)
        if not self.last:
            return x
        x = self._mark(x, 0)
        return rmsnorm(x, P["final_norm"], c.norm_eps)

    def loss_sum(self, tokens: Tensor, targets: Tensor, pos: Tensor, chunk: int = 8192) -> Tensor:
        """Sum of the token cross-entropies over rows with a target (targets -1: none), through the
        output head in chunks of rows (never all the logits of a long micro-batch at once when the
        vocabulary is large). The whole model's stages only (else stage_forward, then head_loss)."""
        return self.head_loss(self.hidden(tokens, pos), targets, chunk)

    def head_loss(self, h: Tensor, targets: Tensor, chunk: int = 8192) -> Tensor:
        """The last stage's loss: the sum of the token cross-entropies of hidden states h (T, d_model),
        vocabulary-parallel under tp (the same on every rank of the group)."""
        W = self._params["lm_head"]
        g = self.tp_group
        hc = copy_to_tp(h, g)
        rows = max(1, min(chunk, (1 << 22) // self.cfg.vocab_size))
        # an empty micro-batch (a ring member without rows) still needs a loss that depends on its
        # hidden states: its backward must run every layer's ring attention, or the ring stalls
        total = None
        for b in range(0, max(1, h.shape[0]), rows):
            logits = hc[b:b + rows] @ W.t()
            if targets.shape[0] == 0:
                part = logits.sum()
            elif g is None:
                part = F.cross_entropy(logits, targets[b:b + rows], ignore_index=-1, reduction="sum")
            else:
                part = vocab_parallel_cross_entropy(logits, targets[b:b + rows], self.v0, g).sum()
            total = part if total is None else total + part
        return total

    def forward(self, tokens: Tensor, targets: Tensor, pos: Tensor) -> Tensor:
        return self.loss_sum(tokens, targets, pos)
