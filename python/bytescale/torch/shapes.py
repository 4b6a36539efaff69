"""The q, k, v an attention entry point receives, checked against what the plan gives this rank.

Every entry point (a pack's `local_attention` / `varlen_attention`, `ring_attention`,
`ulysses_attention`, and so `hdp_attention`) calls `check_qkv` first, so a model that hands over a
tensor of the wrong size gets one ValueError naming the tensor, its shape and the shape expected
(rows, heads, head_dim), instead of a broadcasting error deep in the kernel or a wrong count. On a
ring or an a2a item the check runs before any message is posted, so the rank that raises leaves
nothing half-sent (its peers, running the same model, raise at the same call).
"""

from __future__ import annotations

from torch import Tensor


class ShapeError(ValueError):
    """q, k or v does not have the shape the attention call needs (a ValueError)."""


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(int(x)) for x in t.shape) + ")"


def check_qkv(where: str, q: Tensor, k: Tensor, v: Tensor, rows: int, rows_of: str, min_heads: int = 1) -> None:
    """Raise ShapeError unless q is (rows, H, hd) and k, v are (rows, G, hd) alike, G dividing H
    (GQA), all of q's dtype and device. `where` names the call in the message, `rows_of` where the
    row count comes from ("the rows the plan gives this rank ..."); min_heads: the fewest query heads
    the call can split (a Ulysses group's members)."""
    if q.dim() != 3:
        raise ShapeError(f"{where}: q has shape {_shape(q)}, expected 3 dimensions (rows, heads, head_dim) = "
                         f"({rows}, H, hd): {rows} rows, {rows_of}")
    T, H, hd = (int(x) for x in q.shape)
    if T != rows:
        raise ShapeError(f"{where}: q has shape {_shape(q)}, expected ({rows}, {H}, {hd}): {rows} rows, {rows_of}")
    if H < min_heads:
        raise ShapeError(f"{where}: q has shape {_shape(q)}, {H} heads: the item's Ulysses group of {min_heads} "
                         f"members needs at least {min_heads} query heads, one per member")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3:
            raise ShapeError(f"{where}: {name} has shape {_shape(t)}, expected 3 dimensions (rows, kv_heads, "
                             f"head_dim) = ({rows}, G, {hd}) with G dividing q's {H} heads")
        n, G, d = (int(x) for x in t.shape)
        heads_ok = G > 0 and H % G == 0
        want = f"({rows}, {G if heads_ok else 'G'}, {hd})"
        if n != rows:
            why = f"{rows} rows, {rows_of} (q {_shape(q)})"
        elif not heads_ok:
            why = f"its {G} K/V heads must divide q's {H} query heads (GQA)"
        elif d != hd:
            why = f"head_dim {hd} as q {_shape(q)}"
        elif name == "v" and t.shape != k.shape:
            want, why = _shape(k), "k's shape"
        else:
            why = None
        if why:
            raise ShapeError(f"{where}: {name} has shape {_shape(t)}, expected {want}: {why}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ShapeError(f"{where}: {name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}: "
                             "q, k and v must share dtype and device")
