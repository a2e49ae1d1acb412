"""Operator-level mutation families: the general kinds of porting mistake, applied to any torch call
of a reference, the way mutation-testing tools mutate operators.

Each family is a :class:`golden_ref.catalogue.Mutation` with a `kind`:

* ``drop`` — an op left out (identity in its place): a `tanh` of a soft-cap, the `+ 1` of
  `1 + weight`, a scale, a mask, a residual, a layout op; an optional argument left out (a bias, a
  norm's weight);
* ``operands`` — the operands of a non-commutative op swapped: `cat`/`stack` order, `sub`, `div`,
  `matmul`, `where`'s branches, `masked_fill`'s mask;
* ``boundary`` — off by one: `>` ↔ `>=`, `<` ↔ `<=`, `arange` and slice starts and ends ±1 (or both
  shifted), an integer offset ±1, `tril`/`triu` diagonals ±1;
* ``constant`` — a scalar replaced by its plausible alternatives: 1/√n, √n, 1/n, n for the sizes in
  play (the case's dims, the configuration's fields: `head_dim` for `query_pre_attn_scalar`), an
  eps of another size, a rotary base, a mask's fill value; a norm's eps;
* ``activation`` — an activation, or any elementwise formula of one tensor written out (a tanh
  GELU as `NewGELUActivation` writes it, `x * sigmoid(1.702 * x)`), replaced by each of the
  standard activations;
* ``axes`` — a reduction or softmax over another axis, a transpose of other axes, a permutation
  with two axes exchanged, heads split in the other order, `repeat` ↔ `repeat_interleave`, a
  split's pieces (a gate and its up projection) in the other order, an operand transposed;
* ``precision`` — an upcast dropped (the op in the input's dtype), or the reverse: an op of
  float16/bfloat16 tensors computed in float32.

Submodule-level mistakes (a module skipped, two swapped, pre- vs post-norm, a residual from another
point) are in :mod:`golden_ref.structure`. A match names the call's site and source line, what the
reference does instead and the fix in candle terms.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .catalogue import (Mutation, _add, _dims, _eps_options, _eps_value, _fmt, _is_number,
                        _norm_dim, _norm_eps, _norm_ok, _NORMS)

# --- which ops are which -------------------------------------------------------------------------

UNARY = frozenset((
    "abs", "neg", "exp", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "sin",
    "cos", "erf", "reciprocal", "square", "relu", "gelu", "silu", "softplus", "elu", "leaky_relu",
    "mish", "hardtanh", "hardswish", "clamp", "clamp_min", "clamp_max", "clip", "sign",
))
BINARY = frozenset((
    "add", "sub", "mul", "div", "true_divide", "pow", "maximum", "minimum", "__radd__", "__rsub__",
    "__rmul__", "__rdiv__", "__rtruediv__", "__rpow__", "add_", "sub_", "mul_", "div_",
))
CASTS = frozenset(("to", "float", "half", "bfloat16", "double", "type_as"))
# Ops whose output is an elementwise function of their tensor inputs: chains of them are formulas
# (a GELU written out), see `mutations.Flow`; those that are not affine make a formula worth
# comparing with an activation.
ELEMENTWISE = UNARY | BINARY | CASTS
NONLINEAR = (UNARY - {"abs", "neg", "sign"}) | {"pow", "__rpow__", "maximum", "minimum"}

_NEUTRAL = {"add": 0, "sub": 0, "__radd__": 0, "add_": 0, "sub_": 0, "mul": 1, "__rmul__": 1, "mul_": 1,
            "div": 1, "div_": 1, "true_divide": 1, "pow": 1}

# How the port computes an op, in candle terms.
_CANDLE = {
    "tanh": "Tensor::tanh", "sigmoid": "candle_nn::ops::sigmoid", "exp": "Tensor::exp",
    "log": "Tensor::log", "sqrt": "Tensor::sqrt", "rsqrt": "Tensor::sqrt then Tensor::recip",
    "abs": "Tensor::abs", "neg": "Tensor::neg", "erf": "Tensor::erf", "relu": "Tensor::relu",
    "gelu": "Tensor::gelu_erf", "silu": "Tensor::silu", "clamp": "Tensor::clamp",
    "masked_fill": "where_cond(&mask, &fill, &x)", "softmax": "candle_nn::ops::softmax",
    "layer_norm": "candle_nn::LayerNorm", "rms_norm": "candle_nn::RmsNorm",
    "add": "a + b (broadcast_add)", "sub": "a − b (broadcast_sub)", "mul": "a × b (broadcast_mul)",
    "div": "a ÷ b (broadcast_div)", "transpose": "Tensor::transpose", "permute": "Tensor::permute",
    "pow": "Tensor::powf", "reciprocal": "Tensor::recip",
}


def _tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _float(x) -> bool:
    return _tensor(x) and x.is_floating_point()


def _code(c) -> str:
    """The call's source text, backquoted, when it is known."""
    text = getattr(c.site, "text", None) if c.site is not None else None
    return f"`{text}`" if text else c.name


def _operands(c):
    """The two operands of a binary op as given: (a, b)."""
    if len(c.args) >= 2:
        return c.args[0], c.args[1]
    if len(c.args) == 1:
        other = c.kwargs.get("other", c.kwargs.get("exponent"))
        return c.args[0], other
    return c.kwargs.get("input"), c.kwargs.get("other")


def _scalar_operand(c):
    """The scalar operand of a binary op of a tensor and a number: (where, value) or None."""
    for i, a in enumerate(c.args[1:], start=1):
        if _is_number(a):
            return i, a
    for name in ("other", "exponent", "alpha"):
        if _is_number(c.kwargs.get(name)):
            return name, c.kwargs[name]
    return None


def _with_scalar(c, value):
    where, _ = _scalar_operand(c)
    if isinstance(where, int):
        args = list(c.args)
        args[where] = value
        return c.func(*args, **c.kwargs)
    return c.func(*c.args, **{**c.kwargs, where: value})


# --- drop: an op left out ------------------------------------------------------------------------

_LAYOUT = frozenset(("transpose", "permute", "t", "swapaxes", "movedim"))
_DROP_UNARY = (UNARY - {"neg"}) | frozenset(("softmax", "log_softmax"))
_DROP_OPS = _DROP_UNARY | _LAYOUT | frozenset(("masked_fill", "masked_fill_", "layer_norm", "rms_norm",
                                               "group_norm", "neg")) | BINARY


def _base_op(op: str) -> str:
    """`__radd__` -> `add`, `mul_` -> `mul`."""
    if op.startswith("__r") and op.endswith("__"):
        return op[3:-2]
    return op.strip("_")


def _mask_like(t) -> bool:
    return _float(t) and t.numel() > 0 and bool((t <= -1e4).any())


def _drop_options(c):
    x = c.input
    if not _tensor(x):
        return []
    if c.op in _LAYOUT:
        return ["dropped"] if x.dim() >= 2 else []
    if c.op in ("masked_fill", "masked_fill_", "layer_norm", "rms_norm", "group_norm", "neg") or c.op in _DROP_UNARY:
        return ["dropped"]
    if c.op in BINARY:
        found = _scalar_operand(c)
        if found is not None:
            _, s = found
            if c.op.startswith("__r") and c.op not in ("__radd__", "__rmul__"):
                return []  # s − x, s / x: not the tensor with something dropped
            if c.op in ("add", "__radd__", "add_", "sub", "sub_") and 0 < abs(s) <= 1e-3:
                return []  # an eps: the constant family tries it smaller, down to 1e-12
            return [] if _NEUTRAL.get(c.op) == s else ["dropped"]
        a, b = _operands(c)
        if not (_tensor(a) and _tensor(b)) or c.op in ("pow", "maximum", "minimum"):
            return []
        out = []
        shape = torch.broadcast_shapes(a.shape, b.shape)
        if a.shape == shape:
            out.append("first")
        if b.shape == shape and c.op in ("add", "mul", "__radd__", "__rmul__", "add_", "mul_"):
            out.append("second")
        return out
    return []


def _drop_apply(c, label):
    if c.op in BINARY:
        if label == "dropped":
            return c.input
        a, b = _operands(c)
        kept = a if label == "first" else b
        return kept.to(c.output.dtype) if kept.dtype != c.output.dtype else kept
    return c.input


def _drop_what(c, label):
    if c.op in ("masked_fill", "masked_fill_"):
        return f"{c.name} skipped (the mask not applied)"
    if c.op in _LAYOUT:
        return f"{c.name}({', '.join(_fmt(a) for a in c.args[1:])}) dropped"
    if c.op in ("layer_norm", "rms_norm", "group_norm"):
        return f"{c.name} left out (the input not normalised)"
    if c.op in BINARY and label == "dropped":
        _, s = _scalar_operand(c)
        return f"{_code(c)} without its {_fmt(s)}"
    if c.op in BINARY:
        a, b = _operands(c)
        dropped = b if label == "first" else a
        if c.op in ("add", "__radd__", "add_") and _mask_like(dropped):
            return "the additive attention mask not added"
        which = "second" if label == "first" else "first"
        return f"{_code(c)} without its {which} operand"
    return f"{c.name} left out (identity in its place)"


_BINARY_CANDLE = {"add": "(x + s)?", "sub": "(x - s)?", "mul": "(x * s)? or x.affine(s, 0.0)?",
                  "div": "(x / s)?", "pow": "x.powf(s)?"}
_BROADCAST = {"add": "broadcast_add", "sub": "broadcast_sub", "mul": "broadcast_mul", "div": "broadcast_div"}


def _drop_fix(c, label):
    op = _base_op(c.op)
    if c.op in _LAYOUT:
        return (f"apply the {c.op} as the reference does ({'.permute' if c.op == 'permute' else '.transpose'}"
                "(..)?, then .contiguous()? before a reshape)")
    if c.op in ("masked_fill", "masked_fill_"):
        return "apply the mask: where_cond(&mask, &fill, &x) (masked_fill)"
    if c.op in BINARY and label == "dropped":
        _, s = _scalar_operand(c)
        how = _BINARY_CANDLE.get(op, "")
        return (f"the port leaves out the {_fmt(s)} of {_code(c)}: compute it as the reference does"
                + (f" (in candle: {how})" if how else ""))
    if c.op in BINARY:
        a, b = _operands(c)
        dropped = b if label == "first" else a
        if c.op in ("add", "__radd__", "add_") and _mask_like(dropped):
            return ("add the mask (−inf or a large negative value where attention is not allowed) to "
                    "the scores before the softmax: scores.broadcast_add(&mask)")
        which = "second" if label == "first" else "first"
        how = _BROADCAST.get(op)
        return (f"the port leaves out the {which} operand of {_code(c)}: compute it as the reference does"
                + (f" (in candle: a.{how}(&b)?)" if how else ""))
    how = _CANDLE.get(op, "")
    return f"apply {c.name} as the reference does at this line" + (f" (in candle: {how})" if how else "")


_add(Mutation("op-dropped", _DROP_OPS, options=_drop_options, apply=_drop_apply, what=_drop_what,
              instead="", fix=_drop_fix, spread=False, kind="drop"))

# Optional tensor arguments (a bias, a norm's weight) left out.
_OPTIONAL = {
    "linear": ("bias",), "layer_norm": ("weight", "bias"), "group_norm": ("weight", "bias"),
    "rms_norm": ("weight",), "batch_norm": ("weight", "bias"), "instance_norm": ("weight", "bias"),
    "conv1d": ("bias",), "conv2d": ("bias",), "conv_transpose1d": ("bias",), "addmm": ("input",),
}
_ARGUMENT_WORDS = {"weight": "its weight (γ)", "bias": "its bias (β)", "input": "its added bias"}


def _argument_options(c):
    if c.op in _NORMS and not _norm_ok(c):
        return []
    if c.op == "addmm":
        return ["input"] if _tensor(c.args[0] if c.args else None) else []
    return [name for name in _OPTIONAL.get(c.op, ()) if _tensor(c.get(name))]


def _argument_apply(c, label):
    if c.op == "addmm":
        return torch.mm(c.args[1], c.args[2])
    return c.run(**{label: None})


def _argument_what(c, label):
    words = _ARGUMENT_WORDS[label]
    if c.op in ("linear", "conv1d", "conv2d", "conv_transpose1d"):
        words = "its bias"
    return f"{c.name} without {words}"


def _argument_fix(c, label):
    if c.op == "linear":
        return "add the bias: candle_nn::linear (not linear_no_bias), Linear::new(w, Some(b))"
    if c.op.startswith("conv"):
        return "add the bias: Conv1d::new(w, Some(b), cfg), broadcast over the channel axis"
    if c.op == "addmm":
        return "add the bias: x.matmul(&w)?.broadcast_add(&b) (GPT-2's Conv1D is x @ W + b)"
    if label == "weight":
        return "multiply by the norm's weight: LayerNorm::new(weight, bias, eps) / RmsNorm::new(weight, eps)"
    return "add the norm's bias: LayerNorm::new(weight, bias, eps), not LayerNorm::new_no_bias"


_add(Mutation("argument-dropped", tuple(_OPTIONAL), options=_argument_options, apply=_argument_apply,
              what=_argument_what, instead="", fix=_argument_fix, kind="drop"))

# --- operands: a non-commutative op's operands swapped -------------------------------------------

_ORDERED = frozenset(("sub", "div", "true_divide", "__rsub__", "__rdiv__", "__rtruediv__", "sub_", "div_"))
_SYMBOL = {"sub": "−", "sub_": "−", "__rsub__": "−", "div": "/", "div_": "/", "true_divide": "/",
           "__rdiv__": "/", "__rtruediv__": "/"}


def _sequence(c):
    tensors = c.get("tensors")
    if not isinstance(tensors, (tuple, list)) or len(tensors) < 2:
        return None
    if not all(_tensor(t) for t in tensors) or all(t is tensors[0] for t in tensors):
        return None
    return list(tensors)


def _operand_options(c):
    if c.op in ("cat", "concat", "concatenate", "stack"):
        seq = _sequence(c)
        if seq is None:
            return []
        out = ["reversed"]
        if len(seq) > 2:
            out += [f"{i},{i + 1}" for i in range(len(seq) - 1)]
        return out
    if c.op in _ORDERED:
        a, b = _operands(c)
        if not _tensor(a):
            return []
        if _tensor(b) and a.shape != b.shape and torch.broadcast_shapes(a.shape, b.shape) != a.shape:
            return []
        return ["swapped"] if (_tensor(b) or _is_number(b)) else []
    if c.op in ("matmul", "mm", "bmm"):
        a, b = _operands(c)
        return ["swapped"] if _tensor(a) and _tensor(b) and a.shape == b.shape and a.shape[-1] == a.shape[-2] \
            and a is not b else []
    if c.op == "where":
        cond = c.get("condition")
        return ["inverted"] if len(c.args) + len(c.kwargs) >= 3 and _tensor(cond) and cond.dtype == torch.bool else []
    if c.op in ("masked_fill", "masked_fill_"):
        mask = c.get("mask")
        return ["inverted"] if _tensor(c.input) and _tensor(mask) and mask.dtype == torch.bool else []
    return []


def _operand_apply(c, label):
    if c.op in ("cat", "concat", "concatenate", "stack"):
        seq = _sequence(c)
        if label == "reversed":
            seq = seq[::-1]
        else:
            i, j = (int(v) for v in label.split(","))
            seq[i], seq[j] = seq[j], seq[i]
        return c.run(tensors=seq)
    if c.op in _ORDERED:
        a, b = _operands(c)
        if _is_number(b):
            if c.op in ("sub", "sub_"):
                return b - a
            if c.op in ("div", "div_", "true_divide"):
                return b / a
            if c.op == "__rsub__":
                return a - b
            return a / b
        return torch.sub(b, a) if c.op in ("sub", "sub_", "__rsub__") else torch.div(b, a)
    if c.op in ("matmul", "mm", "bmm"):
        a, b = _operands(c)
        return c.func(b, a)
    if c.op == "where":
        return c.run(condition=~c.get("condition"))
    return c.run(mask=~c.get("mask"))


def _operand_what(c, label):
    if c.op in ("cat", "concat", "concatenate", "stack"):
        if label == "reversed":
            n = len(_sequence(c))
            return f"{_code(c)} with its {'two' if n == 2 else n} tensors in the other order"
        return f"{_code(c)} with tensors {label.replace(',', ' and ')} swapped"
    if c.op == "where":
        return f"{c.name} with the condition inverted"
    if c.op in ("masked_fill", "masked_fill_"):
        return f"{c.name} with the mask inverted"
    return f"{_code(c)} with its operands swapped ({c.name})"


def _operand_fix(c, label):
    if c.op in ("cat", "concat", "concatenate", "stack"):
        return ("put the pieces in the reference's order: Tensor::cat(&[first, second], dim) as "
                f"{_code(c)} lists them (a class token goes where the reference puts it)")
    if c.op == "where":
        return "swap the branches of where_cond (or invert the mask)"
    if c.op in ("masked_fill", "masked_fill_"):
        return "the reference fills where the mask is true: swap the branches of where_cond"
    return f"compute {_code(c)} with the operands in the reference's order"


_add(Mutation("operands-swapped", ("cat", "concat", "concatenate", "stack", "where", "masked_fill",
                                   "masked_fill_", "matmul", "mm", "bmm") + tuple(_ORDERED),
              options=_operand_options, apply=_operand_apply, what=_operand_what, instead="",
              fix=_operand_fix, spread=False, kind="operands"))

# --- boundary: off by one ------------------------------------------------------------------------

_COMPARE = {"gt": "ge", "ge": "gt", "lt": "le", "le": "lt", "greater": "greater_equal",
            "greater_equal": "greater", "less": "less_equal", "less_equal": "less",
            "__gt__": "__ge__", "__ge__": "__gt__", "__lt__": "__le__", "__le__": "__lt__"}
_SIGN = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "greater": ">", "greater_equal": ">=", "less": "<",
         "less_equal": "<=", "__gt__": ">", "__ge__": ">=", "__lt__": "<", "__le__": "<="}
_SHIFTS = ("start+1", "start-1", "stop+1", "stop-1", "shift+1", "shift-1")


def _arange_bounds(c):
    """(start, end, step) of an arange call given by position or keyword, all ints; else None."""
    args = [a for a in c.args]
    if any(not isinstance(a, int) or isinstance(a, bool) for a in args) or not args:
        if not (args == [] and "end" in c.kwargs):
            return None
    start, end, step = 0, None, 1
    if len(args) == 1:
        end = args[0]
    elif len(args) >= 2:
        start, end = args[0], args[1]
        if len(args) > 2:
            step = args[2]
    start = c.kwargs.get("start", start)
    end = c.kwargs.get("end", end)
    step = c.kwargs.get("step", step)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)) or step != 1:
        return None
    return start, end, step


def _moved(start, stop, label):
    what, by = label[:-2], int(label[-2:])
    if what == "start":
        return start + by, stop
    if what == "stop":
        return start, stop + by
    return start + by, stop + by


def _index_slices(c):
    """The positions of an index tuple that are slices of ints (step 1) or ints."""
    index = c.args[1] if len(c.args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for k, item in enumerate(items):
        if isinstance(item, slice) and item.step in (None, 1) and all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (item.start, item.stop)):
            out.append((k, "slice"))
        elif isinstance(item, int) and not isinstance(item, bool):
            out.append((k, "int"))
    return items, out


def _boundary_options(c):
    if c.op in _COMPARE:
        a, b = _operands(c)
        if not _tensor(a):
            return []
        out = [_COMPARE[c.op]]
        if _integral(a) and (_integral(b) or (isinstance(b, int) and not isinstance(b, bool))):
            # `kv_idx <= q_idx + 1`: a mask's diagonal (a window's edge) one further or nearer.
            out += ["by+1", "by-1"]
        return out
    if c.op == "arange":
        return list(_SHIFTS) if _arange_bounds(c) is not None else []
    if c.op in ("triu", "tril"):
        return ["+1", "-1"] if _tensor(c.input) else []
    if c.op == "__getitem__":
        if not _tensor(c.input):
            return []
        items, positions = _index_slices(c)
        out = []
        for k, kind in positions:
            if kind == "int":
                out += [f"{k}:+1", f"{k}:-1"]
            else:
                item = items[k]
                labels = ["start+1", "start-1", "stop+1", "stop-1"]
                if item.stop is not None:
                    labels += ["shift+1", "shift-1"]
                out += [f"{k}:{label}" for label in labels
                        if not (label.startswith("stop") and item.stop is None)]
        return out
    if c.op == "narrow":
        return ["+1", "-1"] if _tensor(c.input) and len(c.args) >= 3 and isinstance(c.args[2], int) else []
    if c.op in ("add", "sub", "__radd__", "__rsub__") and _tensor(c.input) and not c.input.is_floating_point() \
            and c.input.dtype != torch.bool:
        found = _scalar_operand(c)
        return ["+1", "-1"] if found is not None and isinstance(found[1], int) else []
    return []


def _integral(x) -> bool:
    return _tensor(x) and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool


def _boundary_apply(c, label):
    if c.op in _COMPARE and label.startswith("by"):
        a, b = _operands(c)
        return c.func(a, b + int(label[2:]))
    if c.op in _COMPARE:
        return getattr(torch.Tensor, label)(*c.args, **c.kwargs) if label.startswith("__") else \
            getattr(torch, label)(*c.args, **c.kwargs)
    if c.op == "arange":
        start, end, step = _arange_bounds(c)
        start, end = _moved(start, end, label)
        kwargs = {k: v for k, v in c.kwargs.items() if k not in ("start", "end", "step")}
        return torch.arange(start, end, **kwargs)
    if c.op in ("triu", "tril"):
        return c.run(diagonal=int(c.get("diagonal", 0) or 0) + int(label))
    if c.op == "__getitem__":
        items, _ = _index_slices(c)
        k, what = label.split(":")
        k = int(k)
        items = list(items)
        item = items[k]
        if isinstance(item, int):
            items[k] = item + int(what)
        else:
            start, stop = _moved(item.start or 0, item.stop, what)
            items[k] = slice(start, stop)
        index = tuple(items) if isinstance(c.args[1], tuple) else items[0]
        return c.func(c.args[0], index)
    if c.op == "narrow":
        args = list(c.args)
        args[2] = args[2] + int(label)
        return c.func(*args, **c.kwargs)
    _, s = _scalar_operand(c)
    return _with_scalar(c, s + int(label))


def _boundary_what(c, label):
    if c.op in _COMPARE and label.startswith("by"):
        by = int(label[2:])
        return (f"{_code(c)} with its right side {'+' if by > 0 else '−'} 1 (a mask's diagonal, a window's "
                f"edge, one {'further' if by > 0 else 'nearer'})")
    if c.op in _COMPARE:
        return f"{_code(c)} with {_SIGN[label]} instead of {_SIGN[c.op]}"
    if c.op == "arange":
        start, end, _ = _arange_bounds(c)
        s, e = _moved(start, end, label)
        return f"torch.arange({s}, {e}) instead of arange({start}, {end})"
    if c.op in ("triu", "tril"):
        return f"{c.name}(diagonal={int(c.get('diagonal', 0) or 0) + int(label)})"
    if c.op == "__getitem__":
        items, _ = _index_slices(c)
        k, what = label.split(":")
        item = items[int(k)]
        if isinstance(item, int):
            return f"{_code(c)} with index {item + int(what)} instead of {item} (axis {k} of the index)"
        s, e = _moved(item.start or 0, item.stop, what)
        return (f"{_code(c)} with the slice {_slice(s, e)} instead of {_slice(item.start, item.stop)} "
                f"(axis {k} of the index)")
    if c.op == "narrow":
        return f"{c.name} starting at {c.args[2] + int(label)} instead of {c.args[2]}"
    _, s = _scalar_operand(c)
    return f"{_code(c)} with {s + int(label)} instead of {s}"


def _slice(start, stop):
    return f"[{'' if start in (None, 0) else start}:{'' if stop is None else stop}]"


def _boundary_instead(c, label):
    if c.op in ("triu", "tril"):
        return f"diagonal={int(c.get('diagonal', 0) or 0)}"
    return ""  # the words already say what the reference has


def _boundary_fix(c, label):
    if c.op in ("triu", "tril"):
        return (f"the mask is off by one: use the reference's diagonal ({int(c.get('diagonal', 0) or 0)}: "
                "position i attends to j ≤ i for a causal tril); candle's Tensor::tril2(n) keeps the diagonal")
    if c.op in _COMPARE and label.startswith("by"):
        return (f"off by one: the reference's bound is exactly {_code(c)} (a causal mask lets query i see keys "
                "j ≤ i, the diagonal included; a window of w keys is j > i − w): build the port's mask from "
                "the same comparison")
    if c.op in _COMPARE:
        return (f"off by one: the reference compares with {_SIGN[c.op]} in {_code(c)} (a window of exactly "
                "that many keys, a mask that keeps or drops the diagonal): use the same comparison")
    if c.op in ("arange", "__getitem__", "narrow"):
        return (f"off by one: take the reference's range in {_code(c)} (positions start at "
                "the reference's first index: Tensor::arange(start, end) / narrow(dim, start, len))")
    return f"off by one: use the reference's offset in {_code(c)}"


_add(Mutation("off-by-one", tuple(_COMPARE) + ("arange", "triu", "tril", "__getitem__", "narrow", "add", "sub",
                                                "__radd__", "__rsub__"),
              options=_boundary_options, apply=_boundary_apply, what=_boundary_what, instead=_boundary_instead,
              fix=_boundary_fix, spread=False, kind="boundary"))

# --- constants -----------------------------------------------------------------------------------

_ARITHMETIC = ("add", "sub", "mul", "div", "true_divide", "__radd__", "__rsub__", "__rmul__", "__rdiv__",
               "__rtruediv__", "__rpow__", "pow", "clamp", "clamp_min", "add_", "mul_", "div_", "sub_")
_SCALES = ("mul", "div", "true_divide", "__rmul__", "__rdiv__", "__rtruediv__", "mul_", "div_")
_BASES = (10000.0, 500000.0, 1000000.0)
_FORMS = {"": float, "1/": lambda n: 1 / n, "√": math.sqrt, "1/√": lambda n: 1 / math.sqrt(n)}
# A configuration's fields are sizes the model meant: the plain forms first. The case's dims vary
# from case to case and coincide with small factors: square roots (attention scales) first.
_FORM_ORDER = {"config": ("", "1/", "1/√", "√"), "case": ("1/√", "√", "1/", "")}


def _sizes(c):
    """The sizes in play: (name, value, source) of the configuration's fields (`config`) and the
    case's dims (`case`), ≥ 4 (small sizes coincide with round factors far too often to mean
    anything)."""
    return [(n, v, src) for n, v, src in c.state.get("sizes", ()) if v >= 4]


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-6)


def _as_size(value, sizes):
    """(form, names, n) with form(n) == |value|, the names of every size n; else None."""
    for source, forms in _FORM_ORDER.items():
        for form in forms:
            f = _FORMS[form]
            for _, n, src in sizes:
                if src == source and _close(f(n), abs(value)):
                    names = [name for name, m, _ in sizes if m == n]
                    return form, names, n
    return None


# A scale turned into another form of the same size: √n for n is s squared, 1/√n for √n is 1/s, ...
# (labels that mean the same on every case, whatever the size is there).
_TRANSFORMS = {
    "squared": lambda s: s * abs(s),
    "√": lambda s: math.copysign(math.sqrt(abs(s)), s),
    "1/s": lambda s: 1 / s,
    "1/s²": lambda s: 1 / (s * abs(s)),
    "1/√s": lambda s: math.copysign(1 / math.sqrt(abs(s)), s),
}


def _scale_labels(s, sizes):
    """Alternatives to a scale `s`: the other forms of the same size (s squared, √s, 1/s, …), and,
    when s is a form of a size n0 (1/√head_dim), the same form of every other size in play
    (1/√query_pre_attn_scalar)."""
    if abs(s) in (0, 1):
        return []
    out, seen = [], [abs(s)]
    for label, f in _TRANSFORMS.items():
        value = abs(f(s))
        if not any(_close(value, v) for v in seen):
            seen.append(value)
            out.append(label)
    found = _as_size(s, sizes)
    if found is not None:
        form0, _, n0 = found
        for name, n, _ in sizes:
            value = _FORMS[form0](n)
            if n != n0 and not any(_close(value, v) for v in seen):
                seen.append(value)
                out.append(f"{form0}{name}")
    return out


def _scale_value(s, label, sizes):
    if label in _TRANSFORMS:
        return _TRANSFORMS[label](s)
    sign = 1 if s > 0 else -1
    for form in ("1/√", "1/", "√", ""):
        if label.startswith(form):
            for name, n, _ in sizes:
                if name == label[len(form):]:
                    return sign * _FORMS[form](n)
    raise ValueError(label)


def _fill_options(c):
    value = c.get("value")
    if not _is_number(value) or not _float(c.input):
        return []
    out = []
    for alt in (float("-inf"), torch.finfo(c.input.dtype).min, -1e4, -1e9, 0.0):
        if alt != value and _fmt(alt) not in out:
            out.append(_fmt(alt))
    return out


def _weight_operand(c):
    """For a product with a one-axis tensor broadcast over the other operand's last axis (a norm's
    weight, a gain): its position."""
    if c.op not in ("mul", "__rmul__", "mul_") or len(c.args) < 2:
        return None
    a, b = c.args[0], c.args[1]
    for i, (w, x) in enumerate(((a, b), (b, a))):
        if _float(w) and _float(x) and w.dim() == 1 and x.dim() >= 2 and w.shape[0] == x.shape[-1] > 1:
            return i
    return None


def _constant_options(c):
    if _weight_operand(c) is not None:
        return ["1+w"]
    if c.op in _NORMS:
        return [label for label, _ in _eps_options(_norm_eps(c))] if _norm_ok(c) else []
    if c.op in ("masked_fill", "masked_fill_"):
        return _fill_options(c)
    found = _scalar_operand(c)
    if found is None or not _float(c.input):
        return []
    _, s = found
    if isinstance(s, bool) or s == 0:
        return []
    out = []
    if c.op in ("add", "__radd__", "add_", "clamp", "clamp_min", "sub", "sub_") and 0 < abs(s) <= 1e-3:
        out += [label for label, _ in _eps_options(abs(s))] + (["1e-08"] if abs(s) != 1e-8 else [])
    elif c.op in ("__rpow__", "pow", "mul", "div", "__rmul__") and abs(s) >= 1000:
        out += [_fmt(b) for b in _BASES if b != abs(s)]
    elif c.op in _SCALES:
        out += _scale_labels(s, _sizes(c))
    return out


def _constant_value(c, label):
    if c.op in _NORMS:
        return _eps_value(_norm_eps(c), label)
    if c.op in ("masked_fill", "masked_fill_"):
        return float(label)
    _, s = _scalar_operand(c)
    if label in ("×10", "÷10"):
        return _eps_value(abs(s), label) * (1 if s > 0 else -1)
    try:
        return float(label) * (1 if s > 0 else -1)
    except ValueError:
        return _scale_value(s, label, _sizes(c))


def _constant_apply(c, label):
    if label == "1+w":
        i = _weight_operand(c)
        args = list(c.args)
        args[i] = 1 + args[i]
        return c.func(*args, **c.kwargs)
    value = _constant_value(c, label)
    if c.op in _NORMS:
        return c.run(eps=value)
    if c.op in ("masked_fill", "masked_fill_"):
        return c.run(value=value)
    return _with_scalar(c, value)


def _named(c, value):
    """A value as a size when it is one (`0.354 = 1/√head_dim (head_dim = 8)`), else the number."""
    found = _as_size(value, _sizes(c))
    if found is None:
        return _fmt(float(value))
    form, names, n = found
    said = " = ".join(names[:3])
    if not form:
        return f"{_fmt(float(value))} ({said})"
    if len(names) == 1:
        return f"{_fmt(float(value))} = {form}{names[0]} ({said} = {n})"
    return f"{_fmt(float(value))} = {form}{n} ({said} = {n})"


def _constant_what(c, label):
    if label == "1+w":
        return f"{_code(c)} with the weight as (1 + weight), Gemma's convention"
    value = _constant_value(c, label)
    if c.op in _NORMS:
        return f"{c.name}(eps={_fmt(value)})"
    if c.op in ("masked_fill", "masked_fill_"):
        return f"{c.name}(value={label})"
    _, s = _scalar_operand(c)
    if c.op in _SCALES:
        how = {"squared": " (the factor squared)", "√": " (the square root of the factor)",
               "1/s": " (the reciprocal of the factor)"}.get(label, "")
        return f"{c.name} by {_named(c, value)} instead of {_named(c, s)}{how}"
    return f"{c.name} with {_fmt(float(value))} instead of {_fmt(float(s))}"


def _constant_instead(c, label):
    if label == "1+w":
        return "the weight as it is"
    if c.op in _NORMS:
        return f"eps={_fmt(_norm_eps(c))}"
    if c.op in ("masked_fill", "masked_fill_"):
        return f"value={_fmt(c.get('value'))}"
    return ""  # "… by x instead of y" says it


def _whole(x) -> bool:
    return abs(x - round(x)) < 1e-6 * max(1.0, abs(x))


def _constant_fix(c, label):
    if label == "1+w":
        return ("multiply by the weight itself, as the reference does: (1 + weight) is Gemma's norm, "
                "not this one")
    if c.op in _NORMS:
        eps = _fmt(_norm_eps(c))
        return (f"use eps = {eps} as the reference does (candle_nn::layer_norm(size, {eps}, vb), "
                f"LayerNorm::new(w, b, eps), RmsNorm::new(w, eps))")
    if c.op in ("masked_fill", "masked_fill_"):
        return f"fill with {_fmt(c.get('value'))} as the reference does"
    _, s = _scalar_operand(c)
    if label == "squared" and c.op in ("div", "div_") and s > 1 and _whole(s * s):
        return (f"divide by {_fmt(float(s))} = √{round(s * s)} as the reference does: an attention scale "
                f"is 1/√head_dim, not 1/head_dim")
    if label == "squared" and c.op in ("mul", "__rmul__", "mul_") and 0 < s < 1 and _whole(1 / (s * s)):
        return (f"multiply by {_fmt(float(s))} = 1/√{round(1 / (s * s))} as the reference does: an "
                f"attention scale is 1/√head_dim, not 1/head_dim")
    if abs(s) >= 1000:
        return f"use the reference's constant {_fmt(float(s))} (a rotary base is the config's rope_theta)"
    if c.op in _SCALES:
        return (f"scale by {_named(c, s)} as the reference does in {_code(c)} (not "
                f"{_named(c, _constant_value(c, label))}): check which size or configuration field it is")
    return f"use the reference's constant {_fmt(float(s))} in {_code(c)}"


_add(Mutation("constant", _ARITHMETIC + _NORMS + ("masked_fill", "masked_fill_"), options=_constant_options,
              apply=_constant_apply, what=_constant_what, instead=_constant_instead, fix=_constant_fix,
              kind="constant"))

# --- activations, and formulas of one tensor -----------------------------------------------------


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


# name -> (function, how it reads, the candle fix)
STANDARD = {
    "gelu": (F.gelu, "GELU (erf)", "Tensor::gelu_erf (candle_nn::Activation::GeluPytorchTanh is the tanh one)"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "GELU (tanh approximation)",
                  "Tensor::gelu, the tanh approximation (candle_nn::Activation::NewGelu / GeluPytorchTanh)"),
    "quick_gelu": (_quick_gelu, "quick_gelu (x·sigmoid(1.702·x))",
                   "x * sigmoid(1.702 * x) (candle_nn::Activation::QuickGelu)"),
    "silu": (F.silu, "SiLU", "Tensor::silu (candle_nn::ops::silu)"),
    "relu": (F.relu, "ReLU", "Tensor::relu"),
    "sigmoid": (torch.sigmoid, "sigmoid", "candle_nn::ops::sigmoid"),
}
_ACTIVATION_OPS = frozenset(("gelu", "silu", "relu", "sigmoid", "elu", "softplus", "mish", "hardswish"))
_FORMULA_OPS = 12


def _is_standard(c):
    """The standard activation this call is, or None."""
    if c.op == "gelu":
        return "gelu_tanh" if c.get("approximate", "none") == "tanh" else "gelu"
    return c.op if c.op in STANDARD else None


def formula_of(c):
    """For the end of an elementwise formula of one tensor: which standard activation it computes
    (within rounding), or None; worked out on the site's first call and kept there."""
    memo = getattr(c.site, "memo", None)
    if memo is not None and "formula" in memo:
        return memo["formula"]
    found = _formula(c)
    if memo is not None:
        memo["formula"] = found
    return found


def _formula(c):
    chain = c.state.get("chain")
    if chain is None:
        return None
    root = chain[0]()
    out = c.output
    if root is None or not _float(out) or root.shape != out.shape:
        return None
    x = root.to(out.dtype)
    for name, (f, _, _) in STANDARD.items():
        try:
            if torch.allclose(f(x), out, rtol=1e-5, atol=1e-6):
                return name
        except RuntimeError:
            return None
    return None


def _activation_options(c):
    if c.op in _ACTIVATION_OPS and _float(c.input):
        own = _is_standard(c)
        return [name for name in STANDARD if name != own]
    chain = c.state.get("chain")
    # A formula: two ops or more (casts aside), one of them not affine (`1 + weight` is none), and
    # not many (an activation written out is a handful of ops: NewGELU's eight).
    if chain is None or not 2 <= chain[1] <= _FORMULA_OPS or chain[2] < 1:
        return []
    root = chain[0]()
    if root is None or not _float(root) or root.shape != c.output.shape:
        return []
    own = formula_of(c)
    return [f"formula:{name}" for name in STANDARD if name != own]


def _activation_apply(c, label):
    name = label.removeprefix("formula:")
    f = STANDARD[name][0]
    if label.startswith("formula:"):
        return f(c.state["chain"][0]().to(c.output.dtype))
    return f(c.input)


def _activation_what(c, label):
    name = label.removeprefix("formula:")
    if label.startswith("formula:"):
        own = formula_of(c)
        if own:
            return f"{STANDARD[name][1]} in place of the {STANDARD[own][1]} the reference writes out"
        return f"{STANDARD[name][1]} in place of the reference's formula of one tensor (ending in {_code(c)})"
    if c.op == "gelu" and name in ("gelu", "gelu_tanh"):
        return f"{c.name}(approximate='{'tanh' if name == 'gelu_tanh' else 'none'}')"
    return f"{name} instead of {c.op}"


def _activation_instead(c, label):
    if label.startswith("formula:"):
        return ""  # "in place of the … the reference writes out" says it
    if c.op == "gelu":
        return f"approximate='{c.get('approximate', 'none')}'"
    return c.op


def _activation_fix(c, label):
    name = label.removeprefix("formula:")
    if label.startswith("formula:"):
        own = formula_of(c)
        if own:
            return (f"the reference computes {STANDARD[own][1]} here (written out): use {STANDARD[own][2]}, "
                    f"not {STANDARD[name][1]}")
        return f"compute the reference's own formula here, not {STANDARD[name][1]}"
    own = _is_standard(c)
    if own in ("gelu", "gelu_tanh") and name in ("gelu", "gelu_tanh"):
        return ("use Tensor::gelu_erf: candle's Tensor::gelu (and candle_nn::Activation::Gelu) is the tanh "
                "approximation" if own == "gelu" else
                "use Tensor::gelu (the tanh approximation; candle_nn::Activation::NewGelu), not gelu_erf")
    if own in STANDARD:
        return f"the reference applies {STANDARD[own][1]} here: use {STANDARD[own][2]}, not {STANDARD[name][1]}"
    return f"the reference applies {c.op} here, not {STANDARD[name][1]}"


_add(Mutation("activation", _ACTIVATION_OPS | ELEMENTWISE, options=_activation_options, apply=_activation_apply,
              what=_activation_what, instead=_activation_instead, fix=_activation_fix, kind="activation"))

# --- axes ----------------------------------------------------------------------------------------

_REDUCTIONS = frozenset(("sum", "mean", "amax", "amin", "max", "min", "logsumexp", "norm", "var", "std",
                         "cumsum", "prod", "argmax", "argmin", "softmax", "log_softmax"))


def _dim_arg(c):
    """(where, dim) of a reduction's int dim argument."""
    if isinstance(c.kwargs.get("dim"), int) and not isinstance(c.kwargs.get("dim"), bool):
        return "dim", c.kwargs["dim"]
    if c.op in ("norm",):
        return None
    if len(c.args) > 1 and isinstance(c.args[1], int) and not isinstance(c.args[1], bool):
        return 1, c.args[1]
    return None


def _reduction_options(c):
    if not _tensor(c.input):
        return []
    found = _dim_arg(c)
    if found is None:
        return []
    rank = c.input.dim()
    dim = _norm_dim(found[1], rank)
    out = [f"dim={d}" for d in range(rank) if d != dim]
    if c.op == "softmax":
        out.append("log")
    elif c.op == "log_softmax":
        out.append("exp")
    return out


def _reduction_apply(c, label):
    where, dim = _dim_arg(c)
    if label in ("log", "exp"):
        dtype = c.get("dtype") if "dtype" in c.kwargs else None
        f = torch.log_softmax if label == "log" else torch.softmax
        return f(c.input, _norm_dim(dim, c.input.dim()), dtype=dtype)
    new = int(label[4:])
    if isinstance(where, int):
        args = list(c.args)
        args[where] = new
        return c.func(*args, **c.kwargs)
    return c.func(*c.args, **{**c.kwargs, "dim": new})


def _reduction_what(c, label):
    if label in ("log", "exp"):
        return ("log_softmax" if label == "log" else "softmax") + f" instead of {c.op}"
    return f"{c.name}({label})"


def _reduction_fix(c, label):
    dim = _norm_dim(_dim_arg(c)[1], c.input.dim())
    if label in ("log", "exp"):
        return f"the reference applies {c.op} here (candle_nn::ops::{c.op})"
    if c.op in ("softmax", "log_softmax"):
        return (f"normalise over dim {dim} as the reference does: candle_nn::ops::softmax(&x, {dim}) "
                "(softmax_last_dim for the last)")
    return f"reduce over dim {dim} as the reference does ({_code(c)})"


_add(Mutation("reduction-axis", _REDUCTIONS, options=_reduction_options, apply=_reduction_apply,
              what=_reduction_what, instead=lambda c, label: f"dim={_dim_arg(c)[1]}" if label.startswith("dim")
              else c.op, fix=_reduction_fix, kind="axes"))


def _transpose_options(c):
    x = c.input
    if not _tensor(x) or x.dim() < 3 or x.dim() > 5:
        return []
    if c.op in ("transpose", "swapaxes"):
        if len(c.args) < 3:
            return []
        a, b = sorted(_norm_dim(d, x.dim()) for d in c.args[1:3])
        return [f"{i},{j}" for i in range(x.dim()) for j in range(i + 1, x.dim()) if (i, j) != (a, b)]
    if c.op == "permute":
        perm = _perm(c)
        if perm is None:
            return []
        return [f"swap {i},{j}" for i in range(len(perm)) for j in range(i + 1, len(perm))]
    return []


def _perm(c):
    dims = c.args[1:]
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    dims = tuple(c.kwargs.get("dims", dims))
    return list(dims) if dims and all(isinstance(d, int) for d in dims) else None


def _transpose_apply(c, label):
    if c.op == "permute":
        i, j = (int(v) for v in label[5:].split(","))
        perm = _perm(c)
        perm[i], perm[j] = perm[j], perm[i]
        return c.input.permute(*perm)
    i, j = (int(v) for v in label.split(","))
    return c.input.transpose(i, j)


def _transpose_what(c, label):
    if c.op == "permute":
        i, j = (int(v) for v in label[5:].split(","))
        perm = _perm(c)
        perm[i], perm[j] = perm[j], perm[i]
        return f"{c.name}({', '.join(str(p) for p in perm)}) instead of permute({', '.join(str(p) for p in _perm(c))})"
    return f"{c.name}({label.replace(',', ', ')}) instead of {c.op}({', '.join(_fmt(a) for a in c.args[1:3])})"


_add(Mutation("transpose-axes", ("transpose", "swapaxes", "permute"), options=_transpose_options,
              apply=_transpose_apply, what=_transpose_what, instead="",
              fix=lambda c, label: f"move the axes as the reference does: {_code(c)}", kind="axes"))


def _view_options(c):
    if not _tensor(c.input):
        return []
    shape = tuple(c.output.shape)
    if len(shape) < 4:  # splitting heads: (batch, seq, heads, head_dim) and beyond
        return []
    # Equal sizes too: reshaping straight to them still mixes the two axes.
    return [f"{i},{i + 1}" for i in range(len(shape) - 1) if shape[i] > 1 and shape[i + 1] > 1]


def _view_apply(c, label):
    i, j = (int(v) for v in label.split(","))
    shape = list(c.output.shape)
    shape[i], shape[j] = shape[j], shape[i]
    return c.input.reshape(shape).transpose(i, j)


def _swapped(shape, label):
    i, j = (int(v) for v in label.split(","))
    s = list(shape)
    s[i], s[j] = s[j], s[i]
    return s


_add(Mutation(
    "view-order", ("view", "reshape"),
    options=_view_options,
    apply=_view_apply,
    what=lambda c, label: (
        f"{c.name} splitting axes {label.replace(',', ' and ')} in the other order "
        f"(reshaped straight to {_swapped(c.output.shape, label)})"),
    instead=lambda c, label: f"{list(c.output.shape)}",
    fix=lambda c, label: (
        f"reshape to {list(c.output.shape)} as the reference does, then transpose: reshaping "
        f"straight to {_swapped(c.output.shape, label)} mixes the two axes (e.g. positions and heads)"),
    kind="axes",
))


def _pieces(c):
    out = c.output
    if not isinstance(out, (tuple, list)) or len(out) < 2 or not all(_tensor(t) for t in out):
        return None
    return out if all(t.shape == out[0].shape for t in out) else None


_add(Mutation(
    "split-order", ("chunk", "split", "unbind", "tensor_split"),
    options=lambda c: ["reversed"] if _tensor(c.input) and _pieces(c) is not None else [],
    apply=lambda c, label: type(c.output)(list(c.output)[::-1]) if isinstance(c.output, tuple) else list(c.output)[::-1],
    what=lambda c, label: f"the pieces of {_code(c)} taken in the other order",
    instead="",
    fix=lambda c, label: (f"take the pieces of {_code(c)} in the reference's order (e.g. a fused gate_up "
                          "projection: the gate is the first half): Tensor::chunk(n, dim) returns them in order"),
    kind="axes",
))


def _repeat_interleave_options(c):
    repeats, dim = c.get("repeats"), c.get("dim")
    return ["tiled"] if _tensor(c.input) and isinstance(repeats, int) and dim is not None else []


def _tile(x, n, dim):
    sizes = [1] * x.dim()
    sizes[_norm_dim(dim, x.dim())] = n
    return x.repeat(*sizes)


_add(Mutation(
    "repeat-interleave-tiled", "repeat_interleave",
    options=_repeat_interleave_options,
    apply=lambda c, label: _tile(c.input, c.get("repeats"), c.get("dim")),
    what=lambda c, label: f"{c.name} replaced by tiling (Tensor.repeat: 0,1,0,1 instead of 0,0,1,1)",
    instead="interleaved (0,0,1,1)",
    fix="repeat each slice in place (0,0,1,1), as repeat_interleave and candle_transformers::utils::"
        "repeat_kv do, not tiled (0,1,0,1: Tensor::repeat / cat of copies)",
    kind="axes",
))


def _repeat_sizes(c):
    sizes = c.args[1:] if len(c.args) > 2 or (len(c.args) == 2 and isinstance(c.args[1], int)) else (
        tuple(c.args[1]) if len(c.args) > 1 else ())
    return tuple(sizes)


def _repeat_options(c):
    if not _tensor(c.input):
        return []
    sizes = _repeat_sizes(c)
    if len(sizes) != c.input.dim() or sum(1 for s in sizes if s != 1) != 1:
        return []
    return ["interleaved"]


def _repeat_apply(c, label):
    sizes = _repeat_sizes(c)
    dim = next(i for i, s in enumerate(sizes) if s != 1)
    return torch.repeat_interleave(c.input, sizes[dim], dim=dim)


_add(Mutation(
    "repeat-interleaved", "repeat",
    options=_repeat_options,
    apply=_repeat_apply,
    what=lambda c, label: f"{c.name} replaced by repeat_interleave (0,0,1,1 instead of 0,1,0,1)",
    instead="tiled (0,1,0,1)",
    fix="tile the copies (0,1,0,1: Tensor::repeat), as the reference does, not interleave them",
    kind="axes",
))


def _expand_axis(c):
    """The repeat_kv pattern: an input with a size-1 axis k ≥ 1 expanded to n > 1, all else equal."""
    x = c.input
    if not _tensor(x) or x.dim() < 3:
        return None
    sizes = c.args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        sizes = tuple(sizes[0])
    if len(sizes) != x.dim():
        return None
    moved = [k for k, (a, b) in enumerate(zip(x.shape, sizes)) if b != -1 and a != b]
    if len(moved) != 1 or moved[0] == 0 or x.shape[moved[0]] != 1:
        return None
    return moved[0], sizes[moved[0]]


def _expand_tiled(c, label):
    k, n = _expand_axis(c)
    tiled = _tile(c.input.squeeze(k), n, k - 1)
    return tiled.reshape(c.output.shape)


_add(Mutation(
    "expand-tiled", "expand",
    options=lambda c: ["tiled"] if _expand_axis(c) else [],
    apply=_expand_tiled,
    what=lambda c, label: f"{c.name} as tiling: grouped heads repeated 0,1,0,1 instead of 0,0,1,1",
    instead="interleaved (0,0,1,1, as repeat_kv)",
    fix="repeat each KV head in place (h0,h0,h1,h1): candle_transformers::utils::repeat_kv, or "
        "unsqueeze/expand/reshape; not Tensor::repeat or a cat of copies (h0,h1,h0,h1)",
    kind="axes",
))


def _square(t) -> bool:
    return _tensor(t) and t.dim() >= 2 and t.shape[-1] == t.shape[-2] and t.shape[-1] > 1


_add(Mutation(
    "linear-weight-transposed", "linear",
    options=lambda c: ["x @ W"] if _square(c.get("weight")) else [],
    apply=lambda c, label: c.run(weight=c.get("weight").transpose(-2, -1)),
    what=lambda c, label: f"{c.name} with the weight transposed (x @ W)",
    instead="x @ Wᵀ",
    fix="PyTorch stores a Linear weight as [out_features, in_features] and computes x @ Wᵀ: use "
        "candle_nn::Linear::new(w, b) (it transposes) or x.matmul(&w.t()?)",
    kind="axes",
))


def _matmul_operands(c):
    return c.args[0] if c.args else None, c.args[1] if len(c.args) > 1 else None


_add(Mutation(
    "matmul-operand-transposed", ("matmul", "mm", "bmm", "__rmatmul__", "addmm"),
    options=lambda c: [label for label, t in zip(("first", "second"), _matmul_operands(c)
                                                 if c.op != "addmm" else c.args[1:3]) if _square(t)],
    apply=lambda c, label: (
        torch.addmm(c.args[0], *(t.transpose(-2, -1) if k == ("first", "second").index(label) else t
                                 for k, t in enumerate(c.args[1:3]))) if c.op == "addmm" else
        c.func(c.args[0].transpose(-2, -1), c.args[1]) if label == "first"
        else c.func(c.args[0], c.args[1].transpose(-2, -1))),
    what=lambda c, label: f"{c.name} with its {label} operand transposed",
    instead="",
    fix=lambda c, label: f"the port multiplies by the transpose of the {label} operand: drop (or add) "
                         f"its .t()? / .transpose(D::Minus2, D::Minus1)? (GPT-2's Conv1D keeps its weight as "
                         "[in, out]: x @ W, no transpose)",
    kind="axes",
))

# --- precision -----------------------------------------------------------------------------------

_LOW = (torch.float16, torch.bfloat16)


def _upcast_target(c):
    if c.op == "float":
        return torch.float32
    if c.op == "type_as":
        other = c.args[1] if len(c.args) > 1 else None
        return other.dtype if _tensor(other) else None
    for a in list(c.args[1:]) + list(c.kwargs.values()):
        if isinstance(a, torch.dtype):
            return a
    return None


_add(Mutation(
    "upcast-dropped", ("to", "float", "type_as"),
    options=lambda c: ["dropped"] if _tensor(c.input) and c.input.dtype in _LOW
    and _upcast_target(c) in (torch.float32, torch.float64) else [],
    apply=lambda c, label: c.input,
    what=lambda c, label: f"{c.name}({_upcast_target(c)}) skipped: computed in {c.input.dtype}",
    instead=lambda c, label: f"computed in {_upcast_target(c)}",
    fix="compute this part in f32 as the reference does: .to_dtype(DType::F32)? before it and "
        ".to_dtype(dtype)? after",
    kind="precision",
))

_add(Mutation(
    "softmax-upcast-dropped", ("softmax", "log_softmax"),
    options=lambda c: ["dropped"] if _tensor(c.input) and c.input.dtype in _LOW
    and c.kwargs.get("dtype") in (torch.float32, torch.float64) else [],
    apply=lambda c, label: c.func(*c.args, **{k: v for k, v in c.kwargs.items() if k != "dtype"}),
    what=lambda c, label: f"{c.name} in {c.input.dtype} (dtype= dropped)",
    instead=lambda c, label: f"dtype={c.kwargs.get('dtype')}",
    fix="compute the softmax in f32 as the reference does: .to_dtype(DType::F32)? first",
    kind="precision",
))

_UPCASTABLE = (ELEMENTWISE - CASTS) | _REDUCTIONS | frozenset(("matmul", "bmm", "mm", "linear", "layer_norm",
                                                               "rms_norm", "group_norm"))


def _low_tensors(c):
    tensors = [a for a in list(c.args) + list(c.kwargs.values()) if _float(a)]
    return tensors and all(t.dtype in _LOW for t in tensors) and c.kwargs.get("dtype") is None


def _in_f32(c, label):
    def up(a):
        return a.float() if _float(a) else a

    out = c.func(*[up(a) for a in c.args], **{k: up(v) for k, v in c.kwargs.items()})
    return out.to(c.output.dtype) if _tensor(out) else out


_add(Mutation(
    "computed-in-f32", _UPCASTABLE,
    options=lambda c: ["f32"] if _low_tensors(c) else [],
    apply=_in_f32,
    what=lambda c, label: f"{c.name} computed in float32 (then cast back to {c.output.dtype})",
    instead=lambda c, label: f"in {c.output.dtype}",
    fix=lambda c, label: (f"the reference computes {_code(c)} in {c.output.dtype}, not float32: keep the "
                          "input's dtype there (no .to_dtype(DType::F32) around it)"),
    kind="precision",
))

_ = _dims  # re-exported helpers stay in one place: catalogue.py
