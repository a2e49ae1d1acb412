"""Running a reference on one generated case.

Per case the runtime needs three things from the reference:

* `expected`: the reference's output in the case dtype, on exactly the inputs the port got;
* `precise`: the same computation in float64 on the same (already rounded) inputs;
* `rounding`: how far the float64 output moves when every float input and parameter is nudged by
  one unit roundoff of the case dtype (max over a few random nudges). This measures how sensitive
  this computation is to rounding at this point, so the runtime's tolerance can scale with it.

The runtime's `compare.rs` turns these into the pass/fail rule; the float64 parts are best effort
(a reference that cannot run in float64 just gets the strict default tolerance).
"""

from __future__ import annotations

import copy
import traceback

import numpy as np

from .backends import OutputError, flatten_outputs
from .wire import FLOAT_DTYPES, WireTensor

UNIT_ROUNDOFF = {"f32": 2.0**-24, "f64": 2.0**-53, "f16": 2.0**-11, "bf16": 2.0**-8}


class ReferenceRaised(Exception):
    """The reference (or its constructor) raised; `phase` says during what."""

    def __init__(self, phase: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.phase = phase
        self.traceback = "".join(
            traceback.format_exception(type(error), error, error.__traceback__)
        )


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
    try:
        with backend.no_grad():
            out = target(*args, **case.kwargs)
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(phase, e) from None
    return flatten_outputs(out, backend)


def forward(case: Case, perturbations: int = 2):
    """Evaluate the reference; returns a dict of lists of (name, WireTensor) and an error note."""
    backend = case.backend
    native = [backend.to_native(a) for a in case.args]
    module = None
    state_dict = []
    if case.form == "module":
        module = build_module(case)
        for name, value in module.state_dict().items():
            state_dict.append((name, backend.from_native(value, case.dtype)))
        target = module
    else:
        target = case.obj

    expected_native = _call(case, target, native, f"the forward pass in {case.dtype}")
    expected = [(name, backend.from_native(v, case.dtype)) for name, v in expected_native]

    precise, rounding, precise_error = None, None, None
    try:
        precise, rounding = _precise(case, module, native, expected, perturbations)
    except Exception as e:  # best effort: the runtime falls back to the strict tolerance
        precise_error = f"{type(e).__name__}: {e}"
    return {
        "state_dict": state_dict,
        "expected": expected,
        "precise": precise,
        "rounding": rounding,
        "precise_error": precise_error,
    }


def _precise(case: Case, module, native, expected, perturbations: int):
    backend = case.backend
    names = [name for name, _ in expected]
    upcast = [backend.to_float64(x) for x in native]
    target64 = case.obj
    if module is not None:
        target64 = copy.deepcopy(module).to(backend.torch.float64)
    leaves64 = _call(case, target64, upcast, "the float64 evaluation")
    precise = _float64_leaves(backend, leaves64, names)

    unit = UNIT_ROUNDOFF[case.dtype]
    worst = {name: np.zeros(t.array.shape) for name, t in precise}
    for k in range(perturbations):
        rng = np.random.default_rng([case.seed & 0xFFFF_FFFF_FFFF_FFFF, k])
        nudged = [backend.perturb(x, unit, rng) for x in upcast]
        target = target64
        if module is not None:
            target = copy.deepcopy(target64)
            with backend.no_grad():
                for value in target.state_dict().values():
                    if value.is_floating_point():
                        value.copy_(backend.perturb(value, unit, rng))
        leaves = _float64_leaves(backend, _call(case, target, nudged, "a nudged evaluation"), names)
        for (name, base), (_, moved) in zip(precise, leaves):
            if moved.array.shape != base.array.shape:
                raise ValueError(f"`{name}` changed shape under a rounding-sized nudge")
            np.maximum(worst[name], np.abs(moved.array - base.array), out=worst[name])
    rounding = [(name, WireTensor("f64", worst[name])) for name, _ in precise]
    return precise, rounding


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
