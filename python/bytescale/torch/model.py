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
attention for a ring member, so the model itself knows nothing about plans.
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

from .attention import local_attention
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


_current = _Current()


@contextlib.contextmanager
def microbatch_context(mb) -> Iterator[None]:
    """Within the block, HDPAttention / hdp_attention attend as micro-batch `mb` needs: ring attention
    over mb.ring for a ring member, Ulysses attention (all-to-all of heads, and for a hybrid item a
    ring across the groups) over mb.ulysses, blockwise per-segment causal attention over mb's own
    rows for a pack. `mb` is a bytescale.torch.MicroBatch (or anything with `rows` and `ring`)."""
    prev = _current.attention
    rows, ring, group = mb.rows, mb.ring, getattr(mb, "ulysses", None)
    if group is not None:
        _current.attention = lambda q, k, v: ulysses_attention(q, k, v, group)
    elif ring is not None:
        _current.attention = lambda q, k, v: ring_attention(q, k, v, ring)
    else:
        _current.attention = lambda q, k, v: local_attention(q, k, v, rows, None)
    try:
        yield
    finally:
        _current.attention = prev


def hdp_attention(q: Tensor, k: Tensor, v: Tensor, layout: str = "thd") -> Tensor:
    """The attention of the micro-batch being run (inside `microbatch_context`): the one-line
    replacement for a model's attention call.

    layout "thd": q (T, H, hd), k and v (T, G, hd), returns (T, H, hd);
    layout "bhsd": q (1, H, T, hd), k and v (1, G, T, hd) (the layout of
    F.scaled_dot_product_attention), returns (1, H, T, hd).
    q and k must already carry RoPE at the micro-batch's positions (MicroBatch.pos)."""
    fn = _current.attention
    if fn is None:
        raise RuntimeError("hdp_attention outside a micro-batch: run the model inside "
                           "bytescale.torch.microbatch_context(mb)")
    if layout == "thd":
        return fn(q, k, v)
    if layout == "bhsd":
        given = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or (q.shape[0], k.shape[0], v.shape[0]) != (1, 1, 1):
            raise ShapeError(f"layout bhsd: q (1, H, T, hd), k and v (1, G, T, hd) (an HDP micro-batch is one packed "
                             f"row: batch size 1); got {given}")
        try:
            out = fn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1))
        except ShapeError as e:  # the kernels name (rows, heads, head_dim): say what was passed
            raise ShapeError(f"{e} (layout bhsd: shapes above as (T, heads, hd); got {given})") from None
        return out.transpose(0, 1).unsqueeze(0)
    raise ValueError(f"layout {layout!r}: 'thd' or 'bhsd'")


class HDPAttention(nn.Module):
    """An attention module that attends as the running micro-batch needs (see hdp_attention); put it
    where a model calls its attention kernel."""

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
    or fp64 for exactness tests)."""

    def __init__(self, cfg: LlamaConfig, attention: Optional[nn.Module] = None, dtype: torch.dtype = torch.float32,
                 device=None):
        super().__init__()
        self.cfg = cfg
        self.attention = attention if attention is not None else HDPAttention()
        self.layout = []  # (name, offset, shape, decays)
        at = 0
        for name, shape, decay in cfg.tensors():
            self.layout.append((name, at, shape, decay))
            at += math.prod(shape)
        self.flat = torch.zeros(at, dtype=dtype, device=device)
        # every parameter is a view into self.flat: nn.Parameter shares the storage it is given
        self._params: Dict[str, nn.Parameter] = {}
        for name, off, shape, _ in self.layout:
            p = nn.Parameter(self.flat[off:off + math.prod(shape)].view(shape))
            self._params[name] = p
            self.register_parameter(name.replace(".", "_"), p)
        self.grad_hook: Optional[Callable[[int], None]] = None  # set by the trainer (gradient buckets)

    # -- parameters ------------------------------------------------------------------------------------

    def param(self, name: str) -> nn.Parameter:
        """A parameter by its C name (tok_emb, layers.0.wq, ...)."""
        return self._params[name]

    def named_flat_parameters(self) -> List[Tuple[str, nn.Parameter]]:
        """(C name, parameter) in the flat layout's order."""
        return [(name, self._params[name]) for name, _, _, _ in self.layout]

    def buckets(self) -> List[Tuple[int, int]]:
        """Flat ranges of the gradient buckets, in the order the backward finishes them: the head
        (final_norm, lm_head), then layers L-1 .. 0, then the embedding (the C engine's buckets)."""
        off = {name: (o, o + math.prod(s)) for name, o, s, _ in self.layout}
        L = self.cfg.n_layers
        out = [(off["final_norm"][0], off["lm_head"][1])]
        for l in reversed(range(L)):
            out.append((off[f"layers.{l}.attn_norm"][0], off[f"layers.{l}.w_down"][1]))
        out.append(off["tok_emb"])
        return out

    def init_weights(self, seed: int = 0) -> "Llama":
        """normal(0, 0.02) matrices; wo and w_down 0.02 / sqrt(2 n_layers) (GPT-2); norm gains 1. The
        same scheme as the C engine, not the same numbers (its generator is counter-based, rng.h):
        load a checkpoint for identical weights."""
        g = torch.Generator().manual_seed(seed)
        small = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            for name, _, shape, _ in self.layout:
                p = self._params[name]
                if len(shape) == 1:
                    p.fill_(1.0)
                else:
                    std = small if name.endswith(".wo") or name.endswith(".w_down") else 0.02
                    p.copy_(torch.randn(shape, generator=g, dtype=torch.float64).to(p.dtype) * std)
        return self

    # -- forward ---------------------------------------------------------------------------------------

    def _mark(self, x: Tensor, bucket: int) -> Tensor:
        return _Boundary.apply(x, self.grad_hook, bucket) if self.grad_hook is not None and x.requires_grad else x

    def hidden(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """The final normalised hidden states (T, d_model) of one micro-batch's rows (tokens (T,),
        global positions (T,)); attention through self.attention."""
        c = self.cfg
        P = self._params
        T = tokens.shape[0]
        x = F.embedding(tokens, P["tok_emb"])
        cos, sin = rope_tables(pos, c.head_dim, c.rope_theta, x.dtype, x.device)
        for l in range(c.n_layers):
            p = f"layers.{l}."
            # bucket 1 + (L-1-l) is layer l's: its backward is done when this input's gradient is
            x = self._mark(x, 1 + (c.n_layers - 1 - l))
            n = rmsnorm(x, P[p + "attn_norm"], c.norm_eps)
            q = (n @ P[p + "wq"].t()).view(T, c.n_heads, c.head_dim)
            k = (n @ P[p + "wk"].t()).view(T, c.n_kv_heads, c.head_dim)
            v = (n @ P[p + "wv"].t()).view(T, c.n_kv_heads, c.head_dim)
            a = self.attention(rope(q, cos, sin), rope(k, cos, sin), v)
            x = x + a.reshape(T, c.n_heads * c.head_dim) @ P[p + "wo"].t()
            n = rmsnorm(x, P[p + "mlp_norm"], c.norm_eps)
            x = x + (F.silu(n @ P[p + "w_gate"].t()) * (n @ P[p + "w_up"].t())) @ P[p + "w_down"].t()
        x = self._mark(x, 0)
        return rmsnorm(x, P["final_norm"], c.norm_eps)

    def loss_sum(self, tokens: Tensor, targets: Tensor, pos: Tensor, chunk: int = 8192) -> Tensor:
        """Sum of the token cross-entropies over rows with a target (targets -1: none), through the
        output head in chunks of rows (never all the logits of a long micro-batch at once when the
        vocabulary is large)."""
        h = self.hidden(tokens, pos)
        W = self._params["lm_head"]
        rows = max(1, min(chunk, (1 << 22) // self.cfg.vocab_size))
        # an empty micro-batch (a ring member without rows) still needs a loss that depends on its
        # hidden states: its backward must run every layer's ring attention, or the ring stalls
        total = None
        for b in range(0, max(1, h.shape[0]), rows):
            logits = h[b:b + rows] @ W.t()
            if targets.shape[0] == 0:
                part = logits.sum()
            else:
                part = F.cross_entropy(logits, targets[b:b + rows], ignore_index=-1, reduction="sum")
            total = part if total is None else total + part
        return total

    def forward(self, tokens: Tensor, targets: Tensor, pos: Tensor) -> Tensor:
        return self.loss_sum(tokens, targets, pos)
