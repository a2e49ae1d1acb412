"""Structural rewrites of the reference's recorded calls: layouts and pairings a port gets the other
way round, generic over architectures.

* ``fused`` — a fused projection (query/key/value, gate/up) split in the other order: the reference
  lays its output out per head (`[heads, 3, head_dim]`: GPT-NeoX's `view(..., heads, 3 * head_dim)`
  then `chunk(3)`) and the port per tensor (`[3, heads, head_dim]`: chunk first, then split the
  heads), or the reverse. At the reshape that splits the fused axis into heads, the input is read in
  the other layout; at a split of a flat fused axis into equal pieces, each piece is read across the
  heads.

Each is a :class:`golden_ref.catalogue.Mutation` of kind ``structure``, tried like the families'
(:mod:`golden_ref.mutations`). Submodule-level rewrites (a module skipped, pre- vs post-norm, two
residual branches in parallel or in sequence) are in :mod:`golden_ref.structure`; the mistakes of a
configuration (a partial rotary fraction ignored, a per-layer selection ignored) in
:mod:`golden_ref.configs`.
"""

from __future__ import annotations

import torch

from .catalogue import Mutation, _add

_PIECES = (2, 3)


def _tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _head_counts(c):
    """The head counts in play: the configuration's fields that count heads."""
    return sorted({v for name, v, origin in c.state.get("sizes", ())
                   if origin == "config" and "head" in name and "dim" not in name and "/" not in name and v > 1})


# --- a reshape that splits a fused axis into heads ---------------------------------------------------


def _split_view(c):
    """(lead, A, B) when the call reshapes a last axis F into (A, B), A, B > 1; else None."""
    x = c.input
    if not _tensor(x) or x.dim() < 1:
        return None
    out = tuple(c.output.shape)
    if len(out) != x.dim() + 1 or tuple(out[:-2]) != tuple(x.shape[:-1]):
        return None
    a, b = out[-2], out[-1]
    if a < 2 or b < 2 or a * b != x.shape[-1]:
        return None
    return tuple(x.shape[:-1]), a, b


def _fused_view_options(c):
    found = _split_view(c)
    if found is None:
        return []
    _, _, b = found
    return [f"per-tensor:{k}" for k in _PIECES if b % k == 0 and b // k > 1]


def _fused_view_apply(c, label):
    lead, a, b = _split_view(c)
    k = int(label.split(":")[1])
    x = c.input
    # The port reads the flat axis as [k, heads, head_dim]; the reference's reshape and the
    # chunk after it read [heads, k, head_dim]: lay the port's reading out the reference's way.
    regrouped = x.reshape(*lead, k, a, b // k).transpose(-3, -2).reshape(*lead, a * b)
    return c.func(regrouped, *c.args[1:], **c.kwargs)


def _fused_view_what(c, label):
    _, a, b = _split_view(c)
    k = int(label.split(":")[1])
    return (f"the fused projection split per tensor ([{k}, {a}, {b // k}]: {k} pieces, then {a} heads each) "
            f"instead of per head ([{a}, {k}, {b // k}]: {a} heads of {k} pieces each)")


def _fused_view_fix(c, label):
    _, a, b = _split_view(c)
    k = int(label.split(":")[1])
    return (f"the reference's fused output is laid out head by head, its {k} pieces side by side within each "
            f"head: reshape it to (…, {a}, {b}) first, then split each head's {b} values into {k} "
            f"(candle: x.reshape((b, t, {a}, {b}))?.chunk({k}, D::Minus1)), not the flat axis into {k} first")


_add(Mutation("fused-view", ("view", "reshape"), options=_fused_view_options, apply=_fused_view_apply,
              what=_fused_view_what, instead=lambda c, label: "", fix=_fused_view_fix, kind="structure"))


# --- a flat fused axis split into equal pieces --------------------------------------------------------


def _flat_split(c):
    """(pieces, dim) when the call splits a tensor's last axis into equal pieces; else None."""
    x = c.input
    if not _tensor(x):
        return None
    out = c.output
    if not isinstance(out, (tuple, list)) or len(out) not in _PIECES:
        return None
    dim = c.kwargs.get("dim", c.args[2] if len(c.args) > 2 else (-1 if c.op == "chunk" else 0))
    if not isinstance(dim, int) or dim % x.dim() != x.dim() - 1:
        return None
    sizes = {o.shape[-1] for o in out if isinstance(o, torch.Tensor)}
    if len(sizes) != 1:
        return None
    return len(out), dim


def _fused_split_options(c):
    found = _flat_split(c)
    if found is None:
        return []
    k, _ = found
    width = c.input.shape[-1] // k
    return [f"per-head:{k}:{n}" for n in _head_counts(c) if width % n == 0 and width // n > 1]


def _fused_split_apply(c, label):
    _, k, n = label.split(":")
    k, n = int(k), int(n)
    x = c.input
    lead = tuple(x.shape[:-1])
    d = x.shape[-1] // (k * n)
    # The port reads the flat axis as [heads, k, head_dim]; the reference's split reads
    # [k, heads, head_dim].
    regrouped = x.reshape(*lead, n, k, d).transpose(-3, -2).reshape(x.shape)
    return c.func(regrouped, *c.args[1:], **c.kwargs)


def _fused_split_what(c, label):
    _, k, n = label.split(":")
    d = c.input.shape[-1] // (int(k) * int(n))
    return (f"the fused projection split per head ([{n}, {k}, {d}]: {n} heads of {k} pieces each) instead of "
            f"per tensor ([{k}, {n}, {d}])")


def _fused_split_fix(c, label):
    _, k, n = label.split(":")
    return (f"the reference's fused output is laid out piece by piece ({k} pieces, each {n} heads wide): split "
            f"the flat axis into {k} first, then each piece into {n} heads")


_add(Mutation("fused-split", ("chunk", "split", "tensor_split"), options=_fused_split_options,
              apply=_fused_split_apply, what=_fused_split_what, instead=lambda c, label: "", fix=_fused_split_fix,
              kind="structure"))
