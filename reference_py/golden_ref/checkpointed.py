"""A whole model from a checkpoint (`weights = "..."`), as the worker builds and evaluates it: with
no copy of its weights beyond the checkpoint's own mapped files, whatever dtype it is evaluated in.

* **Built without memory for its parameters** (:func:`parameters_on_meta`): while the module is
  constructed, every trainable parameter it registers is put on torch's `meta` device (a shape and
  a dtype, no storage), so its initialisers run on nothing; its buffers are made as its code makes
  them (a rotary embedding's `inv_freq` is computed, not stored). The checkpoint's tensors, views of
  the mapped files in the file's own dtype, are then assigned as its parameters. (The idea is
  accelerate's `init_empty_weights`; a whole model's random init took seconds and its size in
  memory for values the checkpoint replaces.)
* **Evaluated in any dtype without a copy** (:func:`evaluating`): where the checkpoint's dtype is
  not the evaluation's (a bf16 checkpoint checked in float32), each of its tensors is converted as
  an operation reads it, for that operation only — a TorchFunctionMode that knows the checkpoint's
  tensors by identity (and answers `.dtype` for them with the evaluation's, as a model loaded in
  that dtype would), so activations and the reference's own casts are left alone. The float64
  pass converts every low-precision tensor an operation reads (`precision.upcast_mode`), and
  gives a table lookup (`F.embedding`, a gather: exact in any dtype) its table as it is and a
  linear layer of a large weight its weight a slice of output features at a time
  (:func:`float64`). At most one operation's weights exist converted at a time, the largest a
  slice at a time in float64: a bf16 model is never held in float32 or float64.
* **Its pages given back module by module**: after each submodule's forward (a forward hook), the
  mapped pages of the tensors it holds itself go back to the page cache (`states.State.release`),
  so the worker's resident memory is what it is computing with, not the whole checkpoint. A page
  read again comes back from the page cache, without a disk read while the system has the memory.
"""

from __future__ import annotations

import contextlib

from .precision import upcast_mode

# A linear layer's weight larger than this in float64 is upcast a slice of output features at a
# time in the float64 pass (a vocabulary's head: 151936 × 896 is 1.1 GB in float64).
SLICE_BYTES = 64 << 20


@contextlib.contextmanager
def parameters_on_meta(torch):
    """While the block runs, every trainable parameter a module registers is replaced by one of
    the same shape and dtype on the `meta` device (no storage: its initialisers do nothing).
    Frozen parameters (`requires_grad=False`: a fixed table the model computes) and buffers are
    kept as the code makes them."""
    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.requires_grad and not param.is_meta:
            param = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=True)
        return original(module, name, param)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def still_on_meta(module) -> list:
    """The names of the module's parameters and buffers still on the meta device (none the
    checkpoint assigned)."""
    return [name for name, t in module.state_dict(keep_vars=True).items() if t.is_meta]


_CONVERTING = {}


def converting_mode(torch, tensors: dict, target):
    """A TorchFunctionMode that gives every operation the tensors of `tensors` (id -> tensor, the
    checkpoint's) in `target` where they are in another float dtype, and answers `.dtype` for them
    with `target`."""
    key = id(torch)
    if key not in _CONVERTING:
        from torch.overrides import TorchFunctionMode

        # `Tensor.dtype`'s getter (a new method-wrapper at each access: compared with ==).
        dtype_get = torch.Tensor.dtype.__get__

        class Converting(TorchFunctionMode):
            def __init__(self, tensors, target):
                super().__init__()
                self.tensors = tensors
                self.target = target

            def convert(self, value):
                if isinstance(value, torch.Tensor):
                    if id(value) in self.tensors and value.dtype != self.target and value.is_floating_point():
                        return value.to(self.target)
                    return value
                if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
                    return type(value)(self.convert(v) for v in value)
                return value

            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if args and id(args[0]) in self.tensors and func == dtype_get:
                    dtype = func(*args, **kwargs)
                    return self.target if dtype.is_floating_point else dtype
                if getattr(func, "__name__", "") == "__get__":  # `.shape`, `.device`: read, not computed on
                    return func(*args, **kwargs)
                args = tuple(self.convert(a) for a in args)
                kwargs = {k: self.convert(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)

        _CONVERTING[key] = Converting
    return _CONVERTING[key](tensors, target)


def _own_tensors(module) -> list:
    """The tensors a module holds itself (not its children's): its parameters and buffers."""
    own = [p for p in module._parameters.values() if p is not None]
    own.extend(b for b in module._buffers.values() if b is not None)
    return own


def _own_ranges(module) -> list:
    """The memory (address, bytes) of the tensors a module holds itself."""
    return [(t.data_ptr(), t.numel() * t.element_size()) for t in _own_tensors(module)]


@contextlib.contextmanager
def evaluating(torch, module, state, target=None):
    """One evaluation of a checkpoint's `module` (`state`: the checkpoint, `states.State`): after
    each submodule's forward its mapped pages go back to the page cache, and with `target` (the
    evaluation's dtype, when some tensor of the checkpoint is in another) the checkpoint's tensors
    are converted as operations read them (see the module docstring). Enter it before any other
    TorchFunctionMode of the evaluation: where each tensor lies is read as it is set up, not in
    the hooks (a mode would hand them converted copies)."""
    hooks = []
    own = {}
    for submodule in module.modules():
        ranges = _own_ranges(submodule)
        if ranges:
            own[id(submodule)] = ranges

    def release(submodule, *_):
        for address, nbytes in own.get(id(submodule), ()):
            state.release(address, nbytes)

    for submodule in module.modules():
        if id(submodule) in own:
            hooks.append(submodule.register_forward_hook(release, always_call=True))
    mode = contextlib.nullcontext()
    if target is not None:
        tensors = {id(t): t for t in module.state_dict(keep_vars=True).values()}
        if any(t.is_floating_point() and t.dtype != target for t in tensors.values()):
            mode = converting_mode(torch, tensors, target)
    try:
        with mode:
            yield
    finally:
        for hook in hooks:
            hook.remove()
        # What the module's own forward read without a submodule's (a parameter of the root).
        release(module)


_FLOAT64 = {}


def float64_mode(torch):
    """`precision.upcast_mode` for a checkpoint's module: `F.embedding` looks its rows up in the
    table as it is, then upcasts them (a gather rounds nothing: the same values as a lookup in a
    float64 table, without one), and `F.linear` of a weight over `SLICE_BYTES` in float64 runs a
    slice of its output features at a time, each slice of the weight upcast for its product only
    (each output element is the same dot product in float64)."""
    key = id(torch)
    if key not in _FLOAT64:
        Upcast = type(upcast_mode(torch))
        F = torch.nn.functional
        linear = torch._C._nn.linear
        low = {torch.float32, torch.float16, torch.bfloat16}

        def is_low(t):
            return isinstance(t, torch.Tensor) and t.dtype in low

        class Float64(Upcast):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is F.embedding and len(args) >= 2 and is_low(args[1]) and kwargs.get("max_norm") is None \
                        and (len(args) < 4 or args[3] is None):
                    return func(*args, **kwargs).to(torch.float64)
                if func is linear and len(args) >= 2 and is_low(args[1]) and args[1].dim() == 2 \
                        and args[1].numel() * 8 > SLICE_BYTES and not kwargs:
                    x = args[0].to(torch.float64) if is_low(args[0]) else args[0]
                    weight = args[1]
                    bias = args[2] if len(args) > 2 else None
                    step = max(SLICE_BYTES // (8 * weight.shape[1]), 1)
                    parts = []
                    for i in range(0, weight.shape[0], step):
                        b = None if bias is None else bias[i:i + step].to(torch.float64)
                        parts.append(func(x, weight[i:i + step].to(torch.float64), b))
                    return torch.cat(parts, dim=-1)
                return super().__torch_function__(func, types, args, kwargs)

        _FLOAT64[key] = Float64
    return _FLOAT64[key]()


@contextlib.contextmanager
def float64(torch):
    """The float64 pass of a checkpoint's module (`precision.promoted(upcast=True)` with
    :func:`float64_mode`): float64 throughout, its weights upcast as operations read them."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with float64_mode(torch):
            yield
    finally:
        torch.set_default_dtype(previous)
