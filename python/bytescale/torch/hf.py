"""HDP attention for Hugging Face transformers models (docs/torch-hf.md).

    from bytescale.torch import hf
    hf.register()                                       # once; idempotent
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=hf.NAME)
    for mb in bt.microbatches(plan, rank, source):
        with bt.microbatch_context(mb):
            logits = hf.logits(model, mb)          # model(**hf.inputs(mb)).logits
        (hf.loss_sum(logits, mb.targets) / plan.labelled).backward()
    bt.all_reduce_gradients(model)

`register()` adds the attention function `bytescale_hdp` to transformers' attention registry
(`AttentionInterface`) and its mask function to the mask registry (`AttentionMaskInterface`), so
`attn_implementation="bytescale_hdp"` selects it in any model whose attention goes through the
registry (Llama, Qwen2, Mistral and most decoder models of transformers 5). Inside a
`microbatch_context` the function runs `hdp_attention` on the micro-batch's rows (a pack, a ring
member, an a2a or hybrid member, as planned) and the mask function makes no mask (the plan's rows
already say which row sees which); outside one, both are transformers' own `sdpa` functions, so
`model.eval()` losses (padded with an attention_mask, or packed with position_ids restarting at each
document) and `model.generate` (KV cache) run on one rank with the model being trained.

Importing this module imports transformers; `import bytescale.torch` does not.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import current_microbatch, hdp_attention, item_rows

NAME = "bytescale_hdp"

# the small configurations the tests and examples/torch_hf_train.py train (no hub access): 2 layers,
# hidden 64, 4 query heads of 16, 2 K/V heads (GQA), a byte vocabulary
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=8192, tie_word_embeddings=False,
             attention_dropout=0.0)
ARCHS = ("llama", "qwen2", "mistral")


class HDPAttentionError(ValueError):
    """What HDP attention cannot run inside a micro-batch (dropout, a sliding window that cuts a
    sequence, a mask, a KV cache, a batch of several rows, a non-causal module, a member without
    rows given to the model itself), named."""


def register(name: str = NAME) -> str:
    """Register the attention function and its mask function under `name` (idempotent: registering
    again replaces the entries with the same functions). Returns the name, for attn_implementation=."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name


def small_config(arch: str, **overrides):
    """The transformers config of the small `arch` model (llama, qwen2 or mistral; SMALL's sizes):
    built locally, never downloaded. Mistral's sliding window is set past every sequence it trains
    (4096), Qwen2's is off, as in their released configs at these lengths."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    kinds = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if arch not in kinds:
        raise ValueError(f"arch {arch!r}: one of {', '.join(ARCHS)}")
    extra = {"mistral": dict(sliding_window=4096), "qwen2": dict(use_sliding_window=False)}.get(arch, {})
    return kinds[arch](**{**SMALL, **extra, **overrides})


def small_model(arch: str, attn_implementation: str = NAME, seed: int = 0, dtype=torch.float32, **overrides):
    """A small `arch` causal LM (small_config) with weights drawn from `seed` (the same on every process
    and run: the CPU generator), attention `attn_implementation` (registered first when it is ours)."""
    from transformers import AutoModelForCausalLM

    if attn_implementation == NAME:
        register()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(small_config(arch, **overrides), attn_implementation=attn_implementation)
    return model.to(dtype)


def inputs(mb) -> dict:
    """The keyword arguments of a causal LM's forward for micro-batch `mb`: one packed row, input_ids
    mb.tokens[None], position_ids mb.pos[None] (positions restart at each document; a ring member's
    rows carry their positions in the whole sequence), no KV cache. A member without rows (a short
    sequence on a wide ring) cannot run a transformers model at all (its attention reshapes a row of
    0 tokens with -1, which fails): `logits(model, mb)` runs that member's part of the ring."""
    if mb.tokens.shape[0] == 0:
        raise HDPAttentionError("hf.inputs: micro-batch of item %d holds no rows (a member of a ring or a2a item "
                                "wider than its sequences): transformers cannot run a row of 0 tokens; call "
                                "hf.logits(model, mb), which runs this member's part of every layer" % mb.item)
    return dict(input_ids=mb.tokens[None], position_ids=mb.pos[None], use_cache=False)


def logits(model, mb) -> Tensor:
    """model(**inputs(mb)).logits (1, T, V), inside microbatch_context(mb): the forward of a micro-batch.
    For a member without rows, an empty (1, 0, V) that stands for the model's forward: the member
    still has to take its part in every layer's ring or all-to-all, forward and (through a loss of
    these logits) backward, in the layers' order, or its peers wait forever (docs/torch.md, step 3)."""
    if mb.tokens.shape[0] > 0:
        return model(**inputs(mb)).logits
    return _empty_member(model)


def _empty_member(model) -> Tensor:
    """One hdp_attention call per layer on 0 rows of the model's heads, each layer's q, k, v depending
    on the previous layer's output (so the backward reaches them last to first, as the peers'
    backward does), and logits of 0 rows depending on the last."""
    cfg = model.config
    H = int(cfg.num_attention_heads)
    G = int(getattr(cfg, "num_key_value_heads", None) or H)
    D = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // H)
    p = next(model.parameters())
    link = torch.zeros((), dtype=p.dtype, device=p.device, requires_grad=torch.is_grad_enabled())
    for _ in range(int(cfg.num_hidden_layers)):
        q, k, v = (torch.zeros(0, h, D, dtype=p.dtype, device=p.device) + link for h in (H, G, G))
        link = hdp_attention(q, k, v).sum()
    return torch.zeros(1, 0, int(cfg.vocab_size), dtype=p.dtype, device=p.device) + link


def loss_sum(logits: Tensor, targets: Tensor) -> Tensor:
    """Sum of the token cross-entropies of logits (1, T, V) (or (T, V)) against targets (T,) (-1: no
    label), in fp32. Not the model's own `labels=` loss: that one shifts the labels inside the row
    (mixing the documents of a pack, and losing a ring member's last label) and averages per row,
    where HDP needs the sum over the rank's rows divided by the whole batch's labelled tokens. An
    empty micro-batch still gives a loss that depends on its outputs (its backward runs the ring)."""
    lg = logits.reshape(-1, logits.shape[-1]).float()
    if targets.shape[0] == 0:
        return lg.sum()
    return F.cross_entropy(lg, targets, ignore_index=-1, reduction="sum")


def attention_mask(*args, **kwargs):
    """The mask function registered with the attention: none inside a micro-batch, transformers'
    sdpa mask (padding, packed documents, sliding window) outside one."""
    if current_microbatch() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                      **kwargs):
    """transformers' attention call (query (B, H, S, D), key and value (B, G, S, D) not repeated for
    GQA; returns (attn_output (B, S, H, D), None)). Inside a micro-batch: hdp_attention of its rows;
    outside: transformers' sdpa_attention_forward, unchanged."""
    mb = current_microbatch()
    if mb is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    _refuse(module, query, key, attention_mask, dropout, sliding_window, mb, kwargs)
    hd = query.shape[-1]
    factor = 1.0 if scaling is None else float(scaling) * math.sqrt(hd)
    q = query[0].transpose(0, 1)  # (T, H, D)
    if abs(factor - 1.0) > 1e-12:  # the kernels scale by 1/sqrt(D): the module's own scale, through q
        q = q * factor
    out = hdp_attention(q, key[0].transpose(0, 1), value[0].transpose(0, 1))
    return out.unsqueeze(0), None


def _refusal(module, text: str) -> HDPAttentionError:
    """The error of a refusal, naming the layer. Made only when raising: an f-string on the module's
    layer_idx in the normal path would break torch.compile's graph there and recompile it per layer."""
    return HDPAttentionError(f"bytescale_hdp attention (layer {getattr(module, 'layer_idx', '?')}): {text}")


def _refuse(module, query, key, attention_mask, dropout, sliding_window, mb, kwargs) -> None:
    """Raise HDPAttentionError for what hdp_attention cannot compute as the module asks. Every member of
    an item holds the same module and the item's rows, so every member raises alike."""
    if dropout and dropout > 0:
        raise _refusal(module, f"attention dropout {dropout} in training: HDP's kernels have no dropout; "
                               f"set config.attention_dropout = 0")
    if kwargs.get("softcap") is not None:
        raise _refusal(module, f"logit softcapping ({kwargs['softcap']}) is not supported")
    if not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        raise _refusal(module, "a non-causal (bidirectional) module: HDP attention is causal")
    if query.shape[0] != 1:
        raise _refusal(module, f"a batch of {query.shape[0]} rows: an HDP micro-batch is one packed row "
                               f"(input_ids mb.tokens[None]: hf.inputs(mb))")
    if key.shape[2] != query.shape[2]:
        raise _refusal(module, f"{key.shape[2]} keys for {query.shape[2]} queries (a KV cache?): pass "
                               f"use_cache=False inside a micro-batch (hf.inputs(mb) does)")
    if attention_mask is not None:
        raise _refusal(module, f"an attention mask inside a micro-batch: the plan's rows are the mask; "
                               f"pass none (hf.inputs(mb))")
    if sliding_window is not None:
        top = max((int(r.pos.max()) for r in item_rows(mb) if r.n), default=-1)
        if top >= int(sliding_window):
            raise _refusal(module, f"sliding window {sliding_window} would cut a sequence of this item "
                                   f"(a row at position {top} sees {top + 1} tokens): HDP attention is full causal; "
                                   f"plan sequences of at most {sliding_window} tokens (plan_step(context=...)) "
                                   f"or raise config.sliding_window")
