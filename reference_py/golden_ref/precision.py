"""Running a reference in float64 even where its code asks for a lower precision.

golden estimates how much rounding error a computation makes in the case dtype by running the
reference again in float64. A reference that upcasts on purpose (Hugging Face's `LlamaRMSNorm` does
`hidden.to(torch.float32)`, eager attention `softmax(..., dtype=torch.float32)`) would truncate
that float64 run to float32 at those points, and the "precise" result would carry float32's error:
the estimate would then miss most of the error a correct float32 port makes, and a correct port
would fail against it.

`promoted()` is the context for the float64 run: a `TorchFunctionMode` that turns every request
for float32, float16 or bfloat16 inside the reference (a `dtype=` keyword, `Tensor.to(dtype)`,
`.float()`, `.half()`, `.bfloat16()`, `.type(dtype)`) into float64, with float64 as the default
dtype for tensors created without one. Casts to integer or bool types are left alone.
"""

from __future__ import annotations

import contextlib


def _low(torch):
    return {torch.float32, torch.float16, torch.bfloat16}


_PROMOTE = {}
_UPCAST = {}


def promotion_mode(torch):
    """A TorchFunctionMode that computes in float64 wherever the code asks for less (the class is
    made once per torch module: defining a class costs more than a small evaluation)."""
    if id(torch) in _PROMOTE:
        return _PROMOTE[id(torch)]()
    from torch.overrides import TorchFunctionMode

    low = _low(torch)
    to_double = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}

    class Promote(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if kwargs.get("dtype") in low:
                kwargs = {**kwargs, "dtype": torch.float64}
            if func in to_double:
                return args[0].to(torch.float64)
            if func is torch.Tensor.to or func is torch.Tensor.type:
                args = tuple(torch.float64 if a in low else a for a in args)
            return func(*args, **kwargs)

    _PROMOTE[id(torch)] = Promote
    return Promote()


def upcast_mode(torch):
    """`promotion_mode` that also gives every operation its low-precision float tensor arguments
    in float64 (a parameter of a module left in float32, read by `F.linear`): the float64 pass of a
    whole model without a float64 copy of it, each parameter upcast as an operation reads it."""
    if id(torch) in _UPCAST:
        return _UPCAST[id(torch)]()
    low = _low(torch)
    Promote = type(promotion_mode(torch))

    def up(value):
        if isinstance(value, torch.Tensor) and value.dtype in low:
            return value.to(torch.float64)
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return type(value)(up(v) for v in value)
        return value

    class Upcast(Promote):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "__get__":  # `.dtype`, `.shape`: read, not computed on
                return super().__torch_function__(func, types, args, kwargs)
            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in (kwargs or {}).items()}
            return super().__torch_function__(func, types, args, kwargs)

    _UPCAST[id(torch)] = Upcast
    return Upcast()


@contextlib.contextmanager
def promoted(backend, upcast: bool = False):
    """Run the enclosed evaluation in float64 throughout (torch backend; a no-op for NumPy).
    `upcast`: also every low-precision tensor an operation reads (`upcast_mode`)."""
    torch = getattr(backend, "torch", None)
    if torch is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with (upcast_mode(torch) if upcast else promotion_mode(torch)):
            yield
    finally:
        torch.set_default_dtype(previous)
