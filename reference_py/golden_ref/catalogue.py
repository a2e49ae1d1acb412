"""The catalogue of porting mistakes: how one torch call of a reference turns into the usual bug.

When a port does not match, golden re-runs the reference with one of its own operations mutated
(:mod:`golden_ref.mutations`) and reports the mutations under which the reference matches the port.
Each entry here is one kind of mistake: which ops it applies to, the variants it offers for a call
(``options``), how the mutated call computes (``apply``), and how a match reads in the failure
message (``what``, ``instead``, ``fix``, in candle terms).

Add your own next to your reference, like a ``@variant``::

    from golden_ref.catalogue import mutation

    @mutation(ops="softmax", name="softmax of twice the input", fix="do not double the scores",
              of=my_reference)            # optional: only when checking this reference
    def _(call):
        return call.run(input=call.input * 2)

A decorated function gets the :class:`Call` and returns the mutated result, or ``None`` when the
mutation does not apply to this call (it is run on each call of those ops while the reference is
recorded, to find out). ``options=`` (a function of the call returning labels) turns it into a
family: the function then also gets the label, and ``name`` may say it as ``{label}`` (and the op
as ``{op}``).

The built-in mistakes come in two kinds. The operator-level families of :mod:`golden_ref.families`
apply to any call of the ops they name (an op dropped, operands swapped, a boundary off by one, a
constant replaced, an activation or a formula of one tensor replaced, another axis, another
precision); the few entries below name what no family says (a layer norm written out wrong, a
variance's correction, rotary embeddings on pairs, resampling, convolution and padding, the
attention kernel's scale and mask, embeddings scaled by √d). Mistakes at the level of submodule
calls are in :mod:`golden_ref.structure`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Positional parameter names of the ops the catalogue and the families mutate (Tensor methods take the input as
# `self`, at position 0, like the functions).
POSITIONS = {
    "gelu": ("input", "approximate"),
    "silu": ("input", "inplace"),
    "relu": ("input", "inplace"),
    "sigmoid": ("input",),
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    "group_norm": ("input", "num_groups", "weight", "bias", "eps"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"),
    "batch_norm": ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
    "instance_norm": ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps"),
    "softmax": ("input", "dim"),
    "log_softmax": ("input", "dim"),
    "linear": ("input", "weight", "bias"),
    "embedding": ("input", "weight", "padding_idx"),
    "matmul": ("input", "other"),
    "mm": ("input", "mat2"),
    "bmm": ("input", "mat2"),
    "scaled_dot_product_attention": (
        "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
    "conv1d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "conv2d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "pad": ("input", "pad", "mode", "value"),
    "interpolate": ("input", "size", "scale_factor", "mode", "align_corners"),
    "triu": ("input", "diagonal"),
    "tril": ("input", "diagonal"),
    "masked_fill": ("input", "mask", "value"),
    "where": ("condition", "input", "other"),
    "repeat_interleave": ("input", "repeats", "dim"),
    "cat": ("tensors", "dim"),
    "transpose": ("input", "dim0", "dim1"),
    # and those the operator-level families (families.py) read
    "narrow": ("input", "dim", "start", "length"),
    "addmm": ("input", "mat1", "mat2"),
    "stack": ("tensors", "dim"),
    "concat": ("tensors", "dim"),
    "concatenate": ("tensors", "dim"),
}

_MISSING = object()


class Call:
    """One call of a torch op as the reference made it: `func(*args, **kwargs)`, at `site`."""

    __slots__ = ("func", "op", "args", "kwargs", "site", "state", "_output")

    def __init__(self, func, op, args, kwargs, site=None, state=None, output=_MISSING):
        self.func = func
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.site = site
        # What the mode knows beyond the call: the outputs of `neg` so far (for rotate_half).
        self.state = state or {}
        self._output = output

    @property
    def output(self):
        """The unmutated call's result (computed once, when a mutation needs it)."""
        if self._output is _MISSING:
            self._output = self.func(*self.args, **self.kwargs)
        return self._output

    @property
    def input(self):
        return self.args[0] if self.args else next(iter(self.kwargs.values()), None)

    @property
    def functional(self) -> bool:
        """`torch.nn.functional.<op>` (as opposed to `torch.<op>` or a Tensor method)."""
        return getattr(self.func, "__module__", "") in ("torch.nn.functional", "torch._C._nn")

    @property
    def name(self) -> str:
        """How the op reads in a message: `F.gelu`, `torch.softmax`, `Tensor.transpose`."""
        return pretty(self.func)

    def get(self, name: str, default=None):
        """An argument by name, positional or keyword."""
        if name in self.kwargs:
            return self.kwargs[name]
        names = POSITIONS.get(self.op, ())
        if name in names and names.index(name) < len(self.args):
            return self.args[names.index(name)]
        return default

    def given(self, name: str) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    def changed(self, **changes):
        """The arguments with `changes` applied (by position when given positionally)."""
        args = list(self.args)
        kwargs = dict(self.kwargs)
        names = POSITIONS.get(self.op, ())
        for name, value in changes.items():
            if name in names and names.index(name) < len(args) and name not in kwargs:
                args[names.index(name)] = value
            else:
                kwargs[name] = value
        return args, kwargs

    def run(self, **changes):
        """The call itself, with `changes` to its arguments."""
        args, kwargs = self.changed(**changes)
        return self.func(*args, **kwargs)


def pretty(func) -> str:
    name = getattr(func, "__name__", str(func))
    module = getattr(func, "__module__", None) or ""
    qualname = getattr(func, "__qualname__", "") or ""
    if module in ("torch.nn.functional", "torch._C._nn"):
        return f"F.{name}"
    if qualname.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return f"Tensor.{name}"
    return f"torch.{name}"


class Mutation:
    """One kind of porting mistake.

    * `ops`: the op names (`func.__name__`) it applies to;
    * `options(call)`: the labels of the mutations this call admits (empty: it does not apply);
    * `apply(call, label)`: the mutated call's result;
    * `what(call, label)`, `instead(call, label)`, `fix(call, label)`: the message's words;
    * `spread`: also try the mutation at every site where it applies at once (a port makes the
      same mistake wherever it uses the op: candle's Whisper uses the tanh GELU everywhere);
    * `joint`: only at every site at once (a pattern spread over several calls, like rotary
      embeddings: `rotate_half` and the duplicated frequencies); `shown(call)` picks the sites the
      message names;
    * `of`: the references it is for (None: every reference);
    * `kind`: its family, as a failure counts what was tried (`drop`, `operands`, `boundary`,
      `constant`, `activation`, `axes`, `precision`; `catalogue` for the named entries below,
      `yours` for those registered with :func:`mutation`).
    """

    def __init__(self, key, ops, apply, options=None, what=None, instead=None, fix="", spread=True,
                 joint=False, shown=None, of=None, kind="catalogue"):
        self.key = key
        self.ops = frozenset([ops] if isinstance(ops, str) else ops)
        self.apply = apply
        self.options = options or (lambda call: [""])
        self.what = what or (lambda call, label: f"{call.name} {key}")
        self.instead = instead or (lambda call, label: "")
        self.fix = fix
        self.spread = spread
        self.joint = joint
        self.shown = shown or (lambda call: True)
        self.of = of
        self.kind = kind

    def describe(self, call, label):
        fix = self.fix(call, label) if callable(self.fix) else self.fix
        instead = self.instead(call, label) if callable(self.instead) else self.instead
        what = self.what(call, label) if callable(self.what) else self.what
        return what, instead, fix


CATALOGUE: list = []


def mutation(ops, name=None, fix="", options=None, instead="", of=None, spread=True):
    """Register the decorated function as a mutation of the ops `ops` (see the module docstring)."""

    def register(fn):
        key = name or fn.__name__
        if options is None:
            def opts(call):
                try:
                    return [""] if fn(call) is not None else []
                except Exception:
                    return []
            apply = lambda call, label: fn(call)  # noqa: E731
        else:
            opts = options
            apply = fn
        CATALOGUE.append(Mutation(
            key, ops, apply, options=opts,
            what=(lambda call, label: _format(key, label=label, op=call.name)),
            instead=instead, fix=fix, of=of, spread=spread, kind="yours",
        ))
        return fn

    return register


def _format(text: str, **values) -> str:
    try:
        return text.format(**values)
    except (KeyError, IndexError, ValueError):  # braces that are not placeholders
        return text


def _add(*mutations):
    CATALOGUE.extend(mutations)


def _fmt(x) -> str:
    if isinstance(x, float):
        if math.isinf(x):
            return "-inf" if x < 0 else "inf"
        return f"{x:g}"
    return repr(x)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _dims(t) -> int:
    return t.dim() if isinstance(t, torch.Tensor) else 0


def _norm_dim(dim, rank):
    return dim + rank if dim < 0 else dim


# --- norms ---------------------------------------------------------------------------------------

_NORMS = ("layer_norm", "group_norm", "rms_norm", "batch_norm", "instance_norm")
_COMMON_EPS = (1e-3, 1e-5, 1e-6, 1e-12)


def _norm_eps(c):
    eps = c.get("eps")
    if eps is None and c.op == "rms_norm":
        return torch.finfo(c.input.dtype).eps
    if eps is None:
        return 1e-5
    return eps


def _norm_ok(c) -> bool:
    # torch.batch_norm / torch.instance_norm order their arguments differently from F.*.
    return isinstance(c.input, torch.Tensor) and (c.op not in ("batch_norm", "instance_norm") or c.functional)


def _eps_options(eps):
    out = []
    for label, value in (("×10", eps * 10), ("÷10", eps / 10)) + tuple((_fmt(e), e) for e in _COMMON_EPS):
        if not math.isclose(value, eps, rel_tol=1e-9) and not any(
                math.isclose(value, v, rel_tol=1e-9) for _, v in out):
            out.append((label, value))
    return out


def _eps_value(eps, label):
    return dict(_eps_options(eps))[label]




def _layer_norm_by_hand(c, label):
    """The layer norm written out, with the variance unbiased or eps outside the square root."""
    x = c.input
    shape = c.get("normalized_shape")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dims = tuple(range(-len(shape), 0))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, correction=1 if label == "unbiased" else 0, keepdim=True)
    eps = _norm_eps(c)
    y = (x - mean) / (torch.sqrt(var + eps) if label == "unbiased" else torch.sqrt(var) + eps)
    if c.get("weight") is not None:
        y = y * c.get("weight")
    if c.get("bias") is not None:
        y = y + c.get("bias")
    return y


_add(Mutation(
    "norm-by-hand", "layer_norm",
    options=lambda c: ["unbiased", "eps outside"] if isinstance(c.input, torch.Tensor) else [],
    apply=_layer_norm_by_hand,
    what=lambda c, label: (f"{c.name} with the unbiased variance (÷ N−1)" if label == "unbiased"
                           else f"{c.name} with eps outside the square root (÷ (√var + eps))"),
    instead=lambda c, label: "the biased variance (÷ N)" if label == "unbiased" else "÷ √(var + eps)",
    fix=lambda c, label: (
        "a layer norm divides the squared deviations' sum by N (mean_keepdim), not N−1: "
        "var(unbiased=False)" if label == "unbiased" else
        "add eps to the variance inside the square root: ((var + eps)?.sqrt()?)"),
))

_VARIANCES = ("var", "std", "var_mean", "std_mean")


def _correction(c):
    """(input, dim, correction, keepdim) of a var/std call, however it was spelt."""
    args = list(c.args[1:])
    kwargs = dict(c.kwargs)
    dim, correction, keepdim = kwargs.pop("dim", None), None, kwargs.pop("keepdim", False)
    if "correction" in kwargs:
        correction = kwargs.pop("correction")
    if "unbiased" in kwargs:
        correction = 1 if kwargs.pop("unbiased") else 0
    rest = []
    for a in args:
        if isinstance(a, bool) and correction is None:
            correction = 1 if a else 0
        else:
            rest.append(a)
    if rest:
        dim = rest.pop(0)
    if rest:
        keepdim = rest.pop(0)
    return c.input, dim, (1 if correction is None else correction), keepdim


_add(Mutation(
    "variance-correction", _VARIANCES,
    options=lambda c: ["0" if _correction(c)[2] else "1"] if isinstance(c.input, torch.Tensor) else [],
    apply=lambda c, label: getattr(torch, c.op)(
        _correction(c)[0], dim=_correction(c)[1], correction=int(label), keepdim=_correction(c)[3]),
    what=lambda c, label: f"{c.name}(correction={label}) ({'unbiased' if label == '1' else 'biased'})",
    instead=lambda c, label: f"correction={_correction(c)[2]}",
    fix=lambda c, label: (
        "divide by N−1 as the reference does (unbiased): sum of squared deviations / (n − 1)"
        if label == "0" else
        "divide by N as the reference does (biased): mean of the squared deviations"),
))

_add(Mutation(
    "embedding-scaled", "embedding",
    # Only the scale a port adds: one the reference applies and the port leaves out is a dropped
    # op (families.py), named where the reference multiplies.
    options=lambda c: ["×√d"] if len(c.args) > 1 and isinstance(c.args[1], torch.Tensor)
    and c.args[1].dim() == 2 else [],
    apply=lambda c, label: c.run() * math.sqrt(c.args[1].shape[1]),
    what=lambda c, label: f"{c.name} rows scaled {label} (d = {c.args[1].shape[1]})",
    instead="unscaled",
    fix="this reference does not scale the embedding rows by √d_model (Gemma and T5-style ports "
        "do; this one must not)",
))

# --- attention -----------------------------------------------------------------------------------


def _sdpa_scale(c):
    scale = c.get("scale")
    return scale if scale is not None else 1.0 / math.sqrt(c.get("query").shape[-1])


def _sdpa_options(c):
    q = c.get("query")
    if not isinstance(q, torch.Tensor):
        return []
    d = q.shape[-1]
    current = _sdpa_scale(c)
    out = []
    for label, value in (("1/d", 1.0 / d), ("1", 1.0), ("1/√d", 1.0 / math.sqrt(d))):
        if not math.isclose(value, current, rel_tol=1e-6):
            out.append(label)
    if c.get("is_causal", False):
        out.append("not causal")
        if q.shape[-2] > 1:
            out += ["diagonal+1", "diagonal-1"]
    elif c.get("attn_mask") is None and q.shape[-2] > 1:
        out.append("causal")
    if c.get("attn_mask") is not None:
        out.append("no mask")
    k = c.get("key")
    if c.get("enable_gqa", False) and isinstance(k, torch.Tensor) and k.shape[-3] < q.shape[-3]:
        out.append("kv tiled")
    return out


def _sdpa_apply(c, label):
    d = c.get("query").shape[-1]
    if label == "kv tiled":
        # Query head h reads key/value head h mod kv_heads (the heads tiled), where the kernel's
        # grouping gives it head h // (heads / kv_heads).
        groups = c.get("query").shape[-3] // c.get("key").shape[-3]
        tile = lambda t: t.repeat(*([1] * (t.dim() - 3)), groups, 1, 1)  # noqa: E731
        return c.run(key=tile(c.get("key")), value=tile(c.get("value")), enable_gqa=False)
    if label in ("1/d", "1", "1/√d"):
        return c.run(scale={"1/d": 1.0 / d, "1": 1.0, "1/√d": 1.0 / math.sqrt(d)}[label])
    if label.startswith("diagonal"):
        # The causal mask written out with its diagonal moved: query i sees keys j ≤ i ± 1 (the
        # queries are the last of the keys, as with a cache).
        q, k = c.get("query"), c.get("key")
        length, keys = q.shape[-2], k.shape[-2]
        shift = int(label[len("diagonal"):])
        mask = torch.ones(length, keys, dtype=torch.bool, device=q.device).tril(keys - length + shift)
        return c.run(is_causal=False, attn_mask=mask)
    if label == "not causal":
        return c.run(is_causal=False)
    if label == "causal":
        return c.run(is_causal=True)
    return c.run(attn_mask=None)


def _sdpa_what(c, label):
    if label == "kv tiled":
        return (f"{c.name} with its key/value heads tiled to the query heads (head h reads kv head h mod "
                f"{c.get('key').shape[-3]})")
    if label in ("1/d", "1", "1/√d"):
        return f"{c.name}(scale={label})"
    if label.startswith("diagonal"):
        more = label.endswith("+1")
        return (f"{c.name} with its causal mask's diagonal {'one further' if more else 'one nearer'} "
                f"(query i sees keys j ≤ i {'+' if more else '−'} 1)")
    return {"not causal": f"{c.name} without the causal mask (is_causal=False)",
            "causal": f"{c.name} with a causal mask (is_causal=True)",
            "no mask": f"{c.name} without its attn_mask"}[label]


def _sdpa_instead(c, label):
    if label == "kv tiled":
        groups = c.get("query").shape[-3] // c.get("key").shape[-3]
        return f"grouped: query head h reads kv head h // {groups} (enable_gqa)"
    if label in ("1/d", "1", "1/√d"):
        d = c.get("query").shape[-1]
        current = _sdpa_scale(c)
        names = {1.0 / d: "1/d", 1.0: "1", 1.0 / math.sqrt(d): "1/√d"}
        name = next((n for v, n in names.items() if math.isclose(v, current, rel_tol=1e-6)), _fmt(current))
        return f"scale={name}"
    if label.startswith("diagonal"):
        return "is_causal=True: keys j ≤ i"
    return {"not causal": "is_causal=True", "causal": "no mask", "no mask": "the mask applied"}[label]


def _sdpa_fix(c, label):
    if label == "kv tiled":
        groups = c.get("query").shape[-3] // c.get("key").shape[-3]
        return (f"repeat each key/value head {groups} times in a row (repeat_interleave on the heads axis, "
                "as candle-transformers' repeat_kv does), not the whole set of heads")
    if label in ("1/d", "1", "1/√d"):
        return f"scale the scores as the reference does ({_sdpa_instead(c, label)}, head_dim " \
               f"{c.get('query').shape[-1]}): (q.matmul(&k.t()?)? * scale)?"
    if label.startswith("diagonal"):
        return ("the causal mask is one diagonal off: query i attends to keys j ≤ i, the diagonal included "
                "(candle: a mask of (j > i) filled with -inf, e.g. from Tensor::tril2 of ones)")
    return {"not causal": "mask the scores above the diagonal with -inf before the softmax "
                          "(a tril mask and where_cond)",
            "causal": "this attention is not causal: do not mask",
            "no mask": "add the attention mask to the scores before the softmax"}[label]


_add(Mutation("attention", "scaled_dot_product_attention", options=_sdpa_options, apply=_sdpa_apply,
              what=_sdpa_what, instead=_sdpa_instead, fix=_sdpa_fix))


# --- rotary embeddings ---------------------------------------------------------------------------


def _cat_pair(c):
    tensors = c.get("tensors")
    if not isinstance(tensors, (tuple, list)) or len(tensors) != 2:
        return None
    a, b = tensors
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return None
    if _norm_dim(c.get("dim", 0), a.dim()) != a.dim() - 1:
        return None
    return a, b


def _rope_role(c):
    """`cat((-x2, x1), -1)` is rotate_half; `cat((f, f), -1)` duplicates the frequencies."""
    pair = _cat_pair(c)
    if pair is None:
        return None
    a, b = pair
    if a is b:
        return "frequencies"
    negated = c.state.get("negated")
    if negated is not None and negated.holds(a):
        return "rotate_half"
    return None


def _interleave(a, b):
    return torch.stack((a, b), dim=-1).flatten(-2)


def _rope_apply(c, label):
    a, b = _cat_pair(c)
    if _rope_role(c) == "frequencies":
        return _interleave(a, a)
    x = torch.cat((b, -a), dim=-1)  # rotate_half's input, from its two halves
    return _interleave(-x[..., 1::2], x[..., ::2])


_add(Mutation(
    "rope-interleaved", "cat",
    options=lambda c: ["pairs"] if _rope_role(c) else [],
    apply=_rope_apply,
    what=lambda c, label: "rotary embeddings on interleaved pairs (x0,x1),(x2,x3)… (rope_i)",
    instead="the two halves (rotate_half)",
    fix="rotate the two halves as the reference does: candle_nn::rotary_emb::rope (not rope_i, "
        "which pairs neighbouring elements)",
    joint=True,
    shown=lambda c: _rope_role(c) == "rotate_half",
))



def _stack_pair(c):
    """(a, b) of `torch.stack((a, b), dim=-1)` of two same-shaped tensors, else None."""
    tensors = c.get("tensors")
    if not isinstance(tensors, (tuple, list)) or len(tensors) != 2:
        return None
    a, b = tensors
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return None
    if _norm_dim(c.get("dim", 0), a.dim() + 1) != a.dim():
        return None
    return a, b


def _interleaved_role(c):
    """`stack((-x2, x1), -1)` (flattened after) is an interleaved rotation's rotate_half;
    `repeat_interleave(f, 2, -1)` duplicates the frequencies for neighbouring pairs."""
    if c.op == "repeat_interleave":
        x = c.input
        repeats, dim = c.get("repeats"), c.get("dim")
        if isinstance(x, torch.Tensor) and x.is_floating_point() and repeats == 2 and dim in (-1, x.dim() - 1):
            return "frequencies"
        return None
    pair = _stack_pair(c)
    if pair is None:
        return None
    negated = c.state.get("negated")
    if negated is not None and negated.holds(pair[0]):
        return "rotate_half"
    return None


def _halves_apply(c, label):
    if _interleaved_role(c) == "frequencies":
        return torch.cat((c.input, c.input), dim=-1)
    a, b = _stack_pair(c)
    x = _interleave(b, -a)  # the rotation's input: x1 = x[..., ::2], x2 = x[..., 1::2]
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return turned.reshape(*a.shape, 2)  # what the reference flattens next


_add(Mutation(
    "rope-halves", ("stack", "repeat_interleave"),
    options=lambda c: ["halves"] if _interleaved_role(c) else [],
    apply=_halves_apply,
    what=lambda c, label: "rotary embeddings on the two halves (rotate_half, rope) instead of interleaved pairs",
    instead="interleaved pairs (x0,x1),(x2,x3)…",
    fix="rotate neighbouring pairs as the reference does: candle_nn::rotary_emb::rope_i (not rope, which "
        "pairs the two halves), with each frequency repeated for its pair",
    joint=True,
    shown=lambda c: _interleaved_role(c) == "rotate_half",
))

# --- resampling, convolution and padding ---------------------------------------------------------

_LINEAR_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def _interpolate_options(c):
    if not isinstance(c.input, torch.Tensor):
        return []
    mode = c.get("mode", "nearest")
    out = []
    if mode in ("linear", "bilinear", "bicubic", "trilinear"):
        out.append("align_corners")
        out.append("nearest")
    elif mode in ("nearest", "nearest-exact"):
        if c.input.dim() in _LINEAR_MODES:
            out.append(_LINEAR_MODES[c.input.dim()])
        out.append("nearest-exact" if mode == "nearest" else "nearest")
    return out


def _interpolate_apply(c, label):
    if label == "align_corners":
        return c.run(align_corners=not bool(c.get("align_corners")))
    align = None if label.startswith("nearest") else False
    return c.run(mode=label, align_corners=align)


_add(Mutation(
    "interpolate", "interpolate",
    options=_interpolate_options,
    apply=_interpolate_apply,
    what=lambda c, label: (f"{c.name}(align_corners={not bool(c.get('align_corners'))})"
                           if label == "align_corners" else f"{c.name}(mode='{label}')"),
    instead=lambda c, label: (f"align_corners={bool(c.get('align_corners'))}" if label == "align_corners"
                              else f"mode='{c.get('mode', 'nearest')}'"),
    fix=lambda c, label: (
        f"resample as the reference does: mode '{c.get('mode', 'nearest')}', align_corners="
        f"{bool(c.get('align_corners'))} (candle: upsample_nearest2d is mode='nearest', "
        "interpolate_* with align_corners=false)"),
))


def _conv_options(c):
    w = c.get("weight")
    if not isinstance(w, torch.Tensor) or not isinstance(c.input, torch.Tensor):
        return []
    out = []
    padding = c.get("padding", 0)
    if isinstance(padding, str):
        return []
    pads = (padding,) if isinstance(padding, int) else tuple(padding)
    if any(p != 0 for p in pads):
        out.append("padding=0")
    same = tuple(k // 2 for k in w.shape[2:])
    if pads != same and (len(pads) > 1 or pads[0] != same[0]) and any(s != 0 for s in same):
        out.append("padding=" + ",".join(str(s) for s in same))
    stride = c.get("stride", 1)
    if (stride if isinstance(stride, int) else max(stride)) != 1:
        out.append("stride=1")
    if any(k > 1 for k in w.shape[2:]):
        out.append("flipped")
    return out


def _conv_apply(c, label):
    w = c.get("weight")
    if label == "flipped":
        return c.run(weight=w.flip(tuple(range(2, w.dim()))))
    if label == "stride=1":
        return c.run(stride=1)
    values = tuple(int(v) for v in label.split("=")[1].split(","))
    return c.run(padding=values[0] if len(values) == 1 else values)


def _conv_what(c, label):
    return {"flipped": f"{c.name} with the kernel flipped (a true convolution)"}.get(label, f"{c.name}({label})")


def _conv_instead(c, label):
    if label.startswith("padding"):
        return f"padding={c.get('padding', 0)}"
    if label == "stride=1":
        return f"stride={c.get('stride', 1)}"
    return {"flipped": "as a cross-correlation"}[label]


def _conv_fix(c, label):
    if label.startswith("padding"):
        return f"pad as the reference does: Conv1dConfig {{ padding: {c.get('padding', 0)}, .. }}"
    if label == "stride=1":
        return f"use the reference's stride ({c.get('stride', 1)}) in the conv config"
    return {"flipped": "PyTorch's conv is a cross-correlation: do not flip the kernel"}[label]


_add(Mutation("conv", ("conv1d", "conv2d"), options=_conv_options, apply=_conv_apply,
              what=_conv_what, instead=_conv_instead, fix=_conv_fix))


def _pad_options(c):
    pad = c.get("pad")
    if not isinstance(pad, (tuple, list)) or not isinstance(c.input, torch.Tensor):
        return []
    out = []
    pairs = [tuple(pad[i:i + 2]) for i in range(0, len(pad) - 1, 2)]
    if any(a != b for a, b in pairs):
        out.append("sides swapped")
    mode = c.get("mode", "constant")
    for alt in ("constant", "reflect", "replicate"):
        if alt != mode:
            out.append(alt)
    return out


def _pad_apply(c, label):
    pad = list(c.get("pad"))
    if label == "sides swapped":
        swapped = []
        for i in range(0, len(pad) - 1, 2):
            swapped += [pad[i + 1], pad[i]]
        return c.run(pad=tuple(swapped))
    return c.run(mode=label, value=None if label != "constant" else c.get("value"))


_add(Mutation(
    "pad", "pad",
    options=_pad_options,
    apply=_pad_apply,
    what=lambda c, label: (f"{c.name} with the two sides swapped" if label == "sides swapped"
                           else f"{c.name}(mode='{label}')"),
    instead=lambda c, label: (f"pad={tuple(c.get('pad'))}" if label == "sides swapped"
                              else f"mode='{c.get('mode', 'constant')}'"),
    fix=lambda c, label: (f"pad as the reference does: {tuple(c.get('pad'))} is (last-axis left, "
                          "last-axis right, …), starting from the last axis"
                          if label == "sides swapped" else
                          f"pad in mode '{c.get('mode', 'constant')}' (candle: pad_with_zeros / "
                          "pad_with_same)"),
))
