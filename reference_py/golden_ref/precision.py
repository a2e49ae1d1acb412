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


@contextlib.contextmanager
def promoted(backend):
    """Run the enclosed evaluation in float64 throughout (torch backend; a no-op for NumPy)."""
    torch = getattr(backend, "torch", None)
    if torch is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with promotion_mode(torch):
            yield
    finally:
        torch.set_default_dtype(previous)
