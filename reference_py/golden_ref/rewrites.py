"""Structural rewrites of the reference's recorded calls: layouts and pairings a port gets the other
way round, generic over architectures.

* ``switch-flipped`` — a call's boolean switch the other way (`F.batch_norm(training=True)`, a
  resampling's `align_corners`);
* ``scale-inserted`` — the input of a softmax scaled where the reference does not scale it;
* ``prefix-as-whole`` — an op applied to the whole of the last axis where the reference applies it
  to a prefix (`x[..., :r]`) and passes the rest through;
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


# --- a switch of a call the other way -------------------------------------------------------------

# Boolean arguments that change what a call computes (not how: `inplace`, `non_blocking`,
# `keepdim`-like layout flags are left alone).
_SWITCHES = ("training", "align_corners", "antialias", "is_causal", "use_input_stats", "ceil_mode",
             "count_include_pad", "recompute_scale_factor", "unbiased", "normalized", "center")


def _switch_options(c):
    out = []
    for name in _SWITCHES:
        value = c.get(name)
        if isinstance(value, bool):
            out.append(name)
    return out


def _switch_apply(c, label):
    return c.run(**{label: not c.get(label)})


_add(Mutation("switch-flipped", ("batch_norm", "instance_norm", "interpolate", "upsample", "grid_sample",
                                 "affine_grid", "scaled_dot_product_attention", "avg_pool1d", "avg_pool2d",
                                 "max_pool1d", "max_pool2d", "var", "std", "var_mean", "std_mean", "stft"),
              options=_switch_options, apply=_switch_apply,
              what=lambda c, label: f"{c.name}({label}={not c.get(label)})",
              instead=lambda c, label: f"{label}={c.get(label)}",
              fix=lambda c, label: (f"call it with {label}={c.get(label)} as the reference does (a flag of the op, "
                                    "not of the data: e.g. a BatchNorm in eval mode normalises with its running "
                                    "statistics, `training=False`)"),
              kind="constant"))


# --- a scale the reference does not apply -----------------------------------------------------------


def _inserted_scales(c):
    """The scales a port puts before a softmax that the reference does not: 1/√n and 1/n of the
    sizes in play (an attention's 1/√head_dim, where T5's attention has none)."""
    x = c.input
    if not _tensor(x) or x.dim() < 2:
        return []
    out = []
    for name, n, _ in c.state.get("sizes", ()):
        if n < 4:
            continue
        for form in ("1/√", "1/"):
            label = f"{form}{name}"
            if label not in out:
                out.append(label)
    return out


def _inserted_value(c, label):
    for form, f in (("1/√", lambda n: n ** -0.5), ("1/", lambda n: 1.0 / n)):
        if label.startswith(form):
            name = label[len(form):]
            for size_name, n, _ in c.state.get("sizes", ()):
                if size_name == name:
                    return f(n)
    raise ValueError(label)


def _inserted_apply(c, label):
    return c.run(input=c.input * _inserted_value(c, label))


_add(Mutation("scale-inserted", ("softmax", "log_softmax"), options=_inserted_scales, apply=_inserted_apply,
              what=lambda c, label: f"{c.name} of its input scaled by {_inserted_value(c, label):.6g} = {label}",
              instead=lambda c, label: "the input as it is",
              fix=lambda c, label: (f"do not scale the scores before {c.name}: the reference applies no "
                                    f"{label} there (T5's attention, for one, folds it into its weights)"),
              spread=True, kind="constant"))


# --- an op on the whole of an axis, where the reference takes a prefix of it ----------------------------


def _prefix_slice(c):
    """(stop, size) when the call takes `x[..., :stop]` or `x[..., stop:]` of a last axis longer than
    `stop`; else None."""
    x = c.input
    if not _tensor(x) or len(c.args) < 2:
        return None
    index = c.args[1]
    if not isinstance(index, tuple) or len(index) != 2 or index[0] is not Ellipsis:
        return None
    item = index[1]
    size = x.shape[-1]
    if not isinstance(item, slice) or item.step not in (None, 1):
        return None
    if item.start in (None, 0) and isinstance(item.stop, int) and 0 < item.stop < size:
        return ("prefix", item.stop, size)
    if item.stop is None and isinstance(item.start, int) and 0 < item.start < size:
        return ("rest", item.start, size)
    return None


def _whole_options(c):
    return ["whole"] if _prefix_slice(c) is not None else []


def _whole_apply(c, label):
    part, _, _ = _prefix_slice(c)
    return c.input if part == "prefix" else c.input[..., :0]


_add(Mutation("prefix-as-whole", "__getitem__", options=_whole_options, apply=_whole_apply,
              what=lambda c, label: ("the op applied to the whole of the last axis instead of its first "
                                     f"{_prefix_slice(c)[1]} of {_prefix_slice(c)[2]}"),
              instead=lambda c, label: "",
              fix=lambda c, label: (f"apply it to the first {_prefix_slice(c)[1]} of the last axis only, as the "
                                    f"reference's `x[..., :{_prefix_slice(c)[1]}]` does, and pass the rest through "
                                    "(narrow(D::Minus1, 0, n)? then Tensor::cat with the rest)"),
              spread=True, kind="structure"))


# --- a mean subtracted, or not ------------------------------------------------------------------------


def _centering(c):
    """Whether the call is `x - x.mean(dim, keepdim=True)` (a norm's centering)."""
    if c.op not in ("sub", "__sub__") or len(c.args) < 2:
        return False
    a, b = c.args[0], c.args[1]
    if not (_tensor(a) and _tensor(b)) or b.dim() != a.dim() or b.shape[-1] != 1 or a.shape[-1] < 2:
        return False
    with torch.no_grad():
        return bool(torch.allclose(a.mean(-1, keepdim=True), b, rtol=1e-5, atol=1e-6))


_add(Mutation("centering-dropped", ("sub", "__sub__"), options=lambda c: ["uncentered"] if _centering(c) else [],
              apply=lambda c, label: c.args[0],
              what=lambda c, label: f"{c.name} of the mean left out: the input not centered (an RMS norm)",
              instead=lambda c, label: "x − mean(x)",
              fix=lambda c, label: ("subtract the mean as the reference does: it normalises x − mean(x) (a layer "
                                    "norm), not x itself (an RMS norm)"),
              spread=True, kind="drop"))


def _other_norm_options(c):
    return ["rms"] if c.op == "layer_norm" and _tensor(c.input) else (
        ["layer"] if c.op == "rms_norm" and _tensor(c.input) else [])


def _other_norm_apply(c, label):
    x = c.input
    shape = c.get("normalized_shape")
    dims = tuple(range(-len(shape), 0)) if isinstance(shape, (tuple, list, torch.Size)) else (-1,)
    eps = c.get("eps")
    eps = 1e-5 if eps is None else eps
    weight, bias = c.get("weight"), c.get("bias")
    if label == "rms":
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    else:
        centered = x - x.mean(dims, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None and label == "rms":
        y = y + bias
    return y


_add(Mutation("norm-kind", ("layer_norm", "rms_norm"), options=_other_norm_options, apply=_other_norm_apply,
              what=lambda c, label: ("an RMS norm (no mean subtracted) in place of F.layer_norm" if label == "rms"
                                     else "a layer norm (the mean subtracted) in place of F.rms_norm"),
              instead=lambda c, label: "",
              fix=lambda c, label: ("normalise x − mean(x) as the reference's layer norm does (candle_nn::LayerNorm, "
                                    "not RmsNorm)" if label == "rms" else
                                    "normalise by the root mean square without subtracting the mean, as the "
                                    "reference's RMS norm does (candle_nn::RmsNorm, not LayerNorm)"),
              spread=True, kind="catalogue"))
