"""Running a reference on one generated case.

Per case the runtime needs three things from the reference:

* `expected`: the reference's output in the case dtype, on exactly the inputs the port got;
* `precise`: the same computation in float64 on the same (already rounded) inputs;
* `rounding`: the size of the rounding error this computation makes in the case dtype, element by
  element. It is measured at a few inputs (and parameters) nudged by one ulp of the case dtype: at
  each, the reference's own error (case dtype against float64) and the float64 output's move. The
  RMS over the nudges estimates the error's scale; one sample alone is often tiny by chance.
  Rounding errors are chaotic in the input bits, so each nudge gives a fresh sample.

The runtime's `compare.rs` turns these into the pass/fail rule; the float64 parts are best effort
(a reference that cannot run in float64 just gets the strict default tolerance).
"""

from __future__ import annotations

import copy

import numpy as np

from .backends import OutputError, flatten_outputs
from .limits import check_answer
from .tracebacks import format_user_traceback
from .wire import FLOAT_DTYPES, WireTensor

UNIT_ROUNDOFF = {"f32": 2.0**-24, "f64": 2.0**-53, "f16": 2.0**-11, "bf16": 2.0**-8}


class ReferenceRaised(Exception):
    """The reference (or its constructor) raised; `phase` says during what."""

    def __init__(self, phase: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.phase = phase
        self.traceback = format_user_traceback(error)


def torch_dtype(torch, name: str):
    return {
        "f32": torch.float32,
        "f64": torch.float64,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
    }[name]


class Case:
    """One request: which reference, the inputs as wire tensors, consts, init, seed, dtype."""

    def __init__(self, obj, form, backend, args, kwargs, init, seed, dtype):
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"case dtype {dtype!r} is not a float dtype")
        self.obj = obj
        self.form = form
        self.backend = backend
        self.args = args
        self.kwargs = kwargs
        self.init = init
        self.seed = seed
        self.dtype = dtype
        # Module form: also record every submodule's output (forward hooks), see `_call`.
        self.trace = False


def build_module(case: Case):
    """Construct the reference module under the case seed, in eval mode, in the case dtype."""
    torch = case.backend.torch
    torch.manual_seed(case.seed)
    try:
        module = case.obj(**case.init)
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised("constructing the module", e) from None
    if not isinstance(module, torch.nn.Module):
        raise OutputError(
            f"the module form needs an nn.Module class; calling it returned a {type(module).__name__}"
        )
    module.eval()
    return module.to(torch_dtype(torch, case.dtype))


def _call(case: Case, target, args, phase: str):
    backend = case.backend
    backend.seed(case.seed)
    recorded = []
    hooks = _trace_hooks(case, target, recorded)
    try:
        with backend.no_grad():
            out = target(*args, **case.kwargs)
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(phase, e) from None
    finally:
        for hook in hooks:
            hook.remove()
    return flatten_outputs(out, backend) + _trace_leaves(recorded)


def _trace_hooks(case: Case, target, recorded: list):
    """With `case.trace`, a forward hook on every submodule of `target` that records its output as
    `trace.<name>` (the state_dict prefix: what candle's VarBuilder paths give), in execution order.
    Outputs are copied when recorded: a later in-place op must not change them."""
    torch = getattr(case.backend, "torch", None)
    if not case.trace or torch is None or not isinstance(target, torch.nn.Module):
        return []
    hooks = []
    for name, module in target.named_modules():
        if not name:
            continue
        # Wrappers (variants, gradients) hold the reference module as `inner`.
        name = name[len("inner."):] if name.startswith("inner.") else name

        def hook(_module, _inputs, output, name=name):
            try:
                leaves = flatten_outputs(output, case.backend, prefix=name)
            except OutputError:
                return  # an output without tensors is not a trace point
            recorded.append([(n, t.detach().clone()) for n, t in leaves])

        hooks.append(module.register_forward_hook(hook))
    return hooks


def _trace_leaves(recorded: list):
    """The recorded outputs as leaves `trace.<module>`; a module called again is `<module>#2`."""
    calls = {}
    leaves = []
    for outputs in recorded:
        for name, tensor in outputs:
            calls[name] = calls.get(name, 0) + 1
            suffix = f"#{calls[name]}" if calls[name] > 1 else ""
            leaves.append((f"trace.{name}{suffix}", tensor))
    return leaves


def forward(case: Case, perturbations: int = 4, precise: bool = True):
    """Evaluate the reference; returns a dict of lists of (name, WireTensor) and an error note.

    `precise=False` skips the float64 and nudged evaluations (the benchmark's transport figures)."""
    backend = case.backend
    native = [backend.to_native(a) for a in case.args]
    module = None
    state_dict = []
    buffers = []
    if case.form == "module":
        module = build_module(case)
        parameter_names = {n[len("inner."):] if n.startswith("inner.") else n for n, _ in module.named_parameters()}
        for name, value in module.state_dict().items():
            # Wrappers (variants, gradients) hold the reference module as `inner`.
            name = name[len("inner."):] if name.startswith("inner.") else name
            state_dict.append((name, backend.from_native(value, case.dtype)))
            if name not in parameter_names:
                buffers.append(name)
        target = module
    else:
        target = case.obj

    expected_native = _call(case, target, native, f"the forward pass in {case.dtype}")
    # An answer over the frame limit is refused now, from the shapes: before any copy of it.
    check_answer(expected_native, state_dict, case.dtype, precise)
    expected = [(name, backend.from_native(v, case.dtype)) for name, v in expected_native]

    high, rounding, precise_error = None, None, None
    if precise:
        try:
            high, rounding = _precise(case, module, native, expected, perturbations)
        except Exception as e:  # best effort: the runtime falls back to the strict tolerance
            precise_error = f"{type(e).__name__}: {e}"
    return {
        "state_dict": state_dict,
        "buffers": buffers,
        "expected": expected,
        "precise": high,
        "rounding": rounding,
        "precise_error": precise_error,
    }


_UINT = {"f16": np.uint16, "bf16": np.uint16, "f32": np.uint32, "f64": np.uint64}


def nudge(t: WireTensor, rng: np.random.Generator) -> WireTensor:
    """Move every finite non-zero float by one ulp in the case dtype, up or down at random.

    Adding one to the bit pattern moves a float one ulp away from zero, subtracting one moves it
    toward zero; zeros, infinities and NaNs stay as they are.
    """
    if t.dtype not in FLOAT_DTYPES:
        return t
    bits = t.array.view(_UINT[t.dtype]) if t.dtype != "bf16" else t.array
    magnitude_mask = {2: 0x7FFF, 4: 0x7FFF_FFFF, 8: 0x7FFF_FFFF_FFFF_FFFF}[bits.dtype.itemsize]
    exponent_all_ones = {
        ("f16", 2): 0x7C00,
        ("bf16", 2): 0x7F80,
        ("f32", 4): 0x7F80_0000,
        ("f64", 8): 0x7FF0_0000_0000_0000,
    }[(t.dtype, bits.dtype.itemsize)]
    magnitude = bits & bits.dtype.type(magnitude_mask)
    movable = (magnitude != 0) & ((magnitude & bits.dtype.type(exponent_all_ones)) != exponent_all_ones)
    # Stepping up from the largest finite value would reach infinity: step down there instead.
    largest = bits.dtype.type(exponent_all_ones - 1)
    up = rng.integers(0, 2, size=bits.shape).astype(bool) & (magnitude != largest)
    step = np.where(up, bits.dtype.type(1), bits.dtype.type(0))
    down = np.where(up, bits.dtype.type(0), bits.dtype.type(1))
    moved = np.where(movable, bits + step - down, bits)
    array = moved if t.dtype == "bf16" else moved.view(t.array.dtype)
    return WireTensor(t.dtype, array.reshape(t.array.shape))


def _evaluate(case: Case, module, args, phase: str):
    """Evaluate on wire-tensor args (and, in module form, `module` as given)."""
    target = module if module is not None else case.obj
    native = [case.backend.to_native(a) for a in args]
    return _call(case, target, native, phase)


def _module_with_state(module, state: dict, torch):
    copy_ = copy.deepcopy(module)
    with torch.no_grad():
        for name, value in copy_.state_dict().items():
            value.copy_(state[name])
    return copy_


def _precise(case: Case, module, native, expected, perturbations: int):
    backend = case.backend
    names = [name for name, _ in expected]
    upcast = [backend.to_float64(x) for x in native]
    target64 = case.obj
    if module is not None:
        target64 = copy.deepcopy(module).to(backend.torch.float64)
    leaves64 = _call(case, target64, upcast, "the float64 evaluation")
    precise = _float64_leaves(backend, leaves64, names)
    base64 = {name: t.array for name, t in precise}

    # Samples of the rounding error at inputs one ulp away (see the module docstring).
    sum_sq = {name: np.zeros(t.array.shape) for name, t in precise}
    for k in range(perturbations):
        rng = np.random.default_rng([case.seed & 0xFFFF_FFFF_FFFF_FFFF, k])
        args_k = [nudge(a, rng) for a in case.args]
        module_k = module64_k = None
        if module is not None:
            torch = backend.torch
            state = {}
            for name, value in module.state_dict().items():
                if value.is_floating_point():
                    wire_k = nudge(backend.from_native(value, case.dtype), rng)
                    state[name] = backend.to_native(wire_k)
                else:
                    state[name] = value
            module_k = _module_with_state(module, state, torch)
            module64_k = copy.deepcopy(module_k).to(torch.float64)
        low = _evaluate(case, module_k, args_k, "a nudged evaluation")
        native_k = [backend.to_float64(backend.to_native(a)) for a in args_k]
        high = _call(case, module64_k if module is not None else case.obj, native_k, "a nudged evaluation")
        low64 = dict(_float64_leaves(backend, low, names))
        high64 = dict(_float64_leaves(backend, high, names))
        for name in sum_sq:
            own = low64[name].array - high64[name].array  # the reference's rounding error there
            moved = high64[name].array - base64[name]  # the output's sensitivity to the nudge
            if own.shape != sum_sq[name].shape or moved.shape != sum_sq[name].shape:
                raise ValueError(f"`{name}` changed shape under a one-ulp nudge")
            sum_sq[name] += np.maximum(own * own, moved * moved)
    rounding = [
        (name, WireTensor("f64", np.sqrt(sum_sq[name] / max(perturbations, 1))))
        for name, _ in precise
    ]
    return precise, rounding


def variants(case: Case, perturbations: int = 4):
    """Evaluate the reference's registered variants on the case, each as a reference in its own
    right: in the case dtype, in float64 and nudged, so that its rounding is estimated too.

    Returns (name, fix, result of `forward` or None, error or None) per variant; a variant that
    raises on this case cannot match and is reported with its error.
    """
    from .variants import variants_for

    out = []
    for v in variants_for(case.obj):
        if case.form == "module":
            obj = _variant_module(case.obj, v.fn)
        else:
            obj = v.fn
        vcase = Case(obj, case.form, case.backend, case.args, case.kwargs, case.init, case.seed, case.dtype)
        try:
            out.append((v.name, v.fix, forward(vcase, perturbations), None))
        except (ReferenceRaised, OutputError) as e:
            out.append((v.name, v.fix, None, str(e)))
    return out


def gradient_case(case: Case, names: list, wrt: list, params: bool) -> Case:
    """The case of the function (inputs, cotangents) -> gradient of sum(out * cotangent), as a
    reference of its own: golden evaluates it like any reference (case dtype, float64, nudged), so
    gradients get a rounding estimate too.

    `case.args` holds the inputs, then one cotangent per output leaf. `wrt` indexes the inputs to
    differentiate; `params` adds the module's parameters. Leaves are named by argument or parameter;
    a gradient PyTorch does not produce (no dependence) is left out.
    """
    torch = case.backend.torch
    n_inputs = len(names)

    def gradients(call, args, parameters):
        with torch.enable_grad():
            inputs = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args[:n_inputs])]
            cotangents = args[n_inputs:]
            leaves = flatten_outputs(call(*inputs), case.backend)
            if len(leaves) != len(cotangents):
                raise ValueError(f"{len(leaves)} outputs for {len(cotangents)} cotangents")
            total = sum((leaf * c).sum() for (_, leaf), c in zip(leaves, cotangents))
            targets = [(names[i], inputs[i]) for i in wrt] + list(parameters)
            grads = torch.autograd.grad(total, [t for _, t in targets], allow_unused=True)
        return {name: g for (name, _), g in zip(targets, grads) if g is not None}

    if case.form == "module":
        cls = case.obj

        class GradientOf(torch.nn.Module):
            def __init__(self, **init):
                super().__init__()
                self.inner = cls(**init)

            def forward(self, *args, **kwargs):
                parameters = self.inner.named_parameters() if params else []
                return gradients(lambda *a: self.inner(*a, **kwargs), args, parameters)

        obj = GradientOf
    else:
        fn = case.obj

        def obj(*args, **kwargs):
            return gradients(lambda *a: fn(*a, **kwargs), args, [])

    return Case(obj, case.form, case.backend, case.args, case.kwargs, case.init, case.seed, case.dtype)


def _variant_module(cls, fn):
    """A module-form variant as a module: built like the reference (same seed, same weights), its
    forward is `fn(reference_module, *args)`."""
    import torch

    class VariantOf(torch.nn.Module):
        def __init__(self, **init):
            super().__init__()
            self.inner = cls(**init)

        def forward(self, *args, **kwargs):
            return fn(self.inner, *args, **kwargs)

    return VariantOf


def _float64_leaves(backend, leaves, names):
    if [name for name, _ in leaves] != names:
        raise ValueError("the float64 evaluation returned other outputs than the case dtype one")
    out = []
    for name, value in leaves:
        wire = backend.to_float64_wire(value)
        if wire is None:  # integer/bool leaves are compared exactly; no precise version needed
            continue
        out.append((name, wire))
    return out
