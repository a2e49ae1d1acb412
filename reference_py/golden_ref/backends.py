"""How tensors reach a reference: as torch tensors (default) or as NumPy arrays.

A backend converts wire tensors to its native type and back, upcasts floats to float64 for the
precise evaluation, and applies the rounding-sized perturbations the runtime's tolerance rule uses.
"""

from __future__ import annotations

import contextlib

import sys

import numpy as np

from .wire import FLOAT_DTYPES, WireTensor


class BackendError(Exception):
    """The backend cannot be used (e.g. torch is not installed)."""


class OutputError(Exception):
    """A reference returned something that is not a tensor (or a container of tensors)."""


def _writable(array: np.ndarray) -> np.ndarray:
    """Arrays decoded from a frame are writable views of its buffer; copy only read-only ones."""
    return array if array.flags.writeable else array.copy()


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest even, NaN kept NaN) and return the bit patterns."""
    bits = np.asarray(values, dtype=np.float32, order="C").view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


class NumpyBackend:
    name = "numpy"

    def check_available(self):
        return None

    def to_native(self, t: WireTensor):
        if t.dtype == "bf16":
            # NumPy has no bfloat16: the reference sees the same values in float32.
            return bf16_bits_to_f32(t.array)
        return _writable(t.array)

    def is_tensor(self, x) -> bool:
        return isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, (np.str_, np.bytes_))

    def from_native(self, x, case_dtype: str) -> WireTensor:
        x = np.asarray(x)
        kind = x.dtype.kind
        if kind == "f":
            # NumPy promotes to float64 at the slightest provocation; the numpy backend therefore
            # reports float outputs in the case dtype, which is what a port is expected to return.
            if case_dtype == "bf16":
                return WireTensor("bf16", f32_to_bf16_bits(x.astype(np.float32)))
            return WireTensor(case_dtype, x.astype(_NP_FLOAT[case_dtype]))
        return _wire_from_numpy(x)

    def to_float64(self, x):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            return x.astype(np.float64)
        return x

    def perturb(self, x, unit_roundoff: float, rng: np.random.Generator):
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            signs = rng.integers(0, 2, size=x.shape) * 2.0 - 1.0
            return x * (1.0 + unit_roundoff * signs)
        return x

    def seed(self, seed: int):
        return None

    def no_grad(self):
        return contextlib.nullcontext()

    def to_float64_wire(self, x) -> WireTensor | None:
        x = np.asarray(x)
        if x.dtype.kind != "f":
            return None
        return WireTensor("f64", x.astype(np.float64))


_NP_FLOAT = {"f32": np.float32, "f64": np.float64, "f16": np.float16}


def _wire_from_numpy(x: np.ndarray) -> WireTensor:
    table = {
        np.dtype(np.float32): "f32",
        np.dtype(np.float64): "f64",
        np.dtype(np.float16): "f16",
        np.dtype(np.int64): "i64",
        np.dtype(np.int32): "i32",
        np.dtype(np.int16): "i16",
        np.dtype(np.uint32): "u32",
        np.dtype(np.uint8): "u8",
        np.dtype(np.bool_): "bool",
    }
    name = table.get(x.dtype)
    if name is None:
        raise OutputError(f"an output has dtype {x.dtype}, which golden cannot carry")
    return WireTensor(name, np.asarray(x, order="C"))


class TorchBackend:
    name = "torch"

    def __init__(self):
        self._torch = None

    @property
    def torch(self):
        if self._torch is None:
            try:
                import torch  # noqa: PLC0415 - imported on first use: it costs ~1.6 s
            except ImportError as e:
                raise BackendError(
                    f"the torch backend needs PyTorch, which this interpreter cannot import ({e}). "
                    "Install it into the interpreter golden uses (`cargo xtask setup` does), "
                    'or declare `backend = "numpy"` for a NumPy reference.'
                ) from None
            # One intra-op thread: reductions then always sum in the same order, so reference
            # outputs (and the snapshots made from them) are identical on every machine.
            torch.set_num_threads(1)
            self._torch = torch
        return self._torch

    def check_available(self):
        return self.torch.__version__

    def to_native(self, t: WireTensor):
        torch = self.torch
        if t.dtype == "bf16":
            return torch.from_numpy(_writable(t.array).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(_writable(t.array))

    def is_tensor(self, x) -> bool:
        return isinstance(x, self.torch.Tensor) or isinstance(x, np.ndarray)

    def from_native(self, x, case_dtype: str) -> WireTensor:
        torch = self.torch
        if isinstance(x, np.ndarray):
            return _wire_from_numpy(x)
        x = x.detach().cpu().contiguous()
        if x.dtype == torch.bfloat16:
            return WireTensor("bf16", x.view(torch.int16).numpy().view(np.uint16))
        name = _TORCH_NAMES.get(str(x.dtype))
        if name is None:
            raise OutputError(f"an output has dtype {x.dtype}, which golden cannot carry")
        return WireTensor(name, x.numpy())

    def to_float64(self, x):
        torch = self.torch
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(torch.float64)
        return x

    def perturb(self, x, unit_roundoff: float, rng: np.random.Generator):
        torch = self.torch
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            signs = torch.from_numpy(rng.integers(0, 2, size=tuple(x.shape)) * 2.0 - 1.0)
            return x * (1.0 + unit_roundoff * signs.to(x.dtype))
        return x

    def seed(self, seed: int):
        # The CPU generator: references run on the CPU. torch.manual_seed would also queue a
        # re-seed of every accelerator's generator, and on a CUDA build of torch that records a
        # stack trace each time (~0.3 ms of a ~1 ms case: it was most of a check's Python time).
        self.torch.default_generator.manual_seed(seed)

    def no_grad(self):
        return self.torch.no_grad()

    def to_float64_wire(self, x) -> WireTensor | None:
        torch = self.torch
        if isinstance(x, np.ndarray):
            return NumpyBackend().to_float64_wire(x)
        if not x.is_floating_point():
            return None
        return WireTensor("f64", x.detach().cpu().to(torch.float64).contiguous().numpy())


_TORCH_NAMES = {
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float16": "f16",
    "torch.int64": "i64",
    "torch.int32": "i32",
    "torch.int16": "i16",
    "torch.uint32": "u32",
    "torch.uint8": "u8",
    "torch.bool": "bool",
}

assert set(_TORCH_NAMES.values()) | {"bf16"} >= set(FLOAT_DTYPES)

BACKENDS = {"torch": TorchBackend, "numpy": NumpyBackend}


def flatten_outputs(out, backend, prefix: str = "out"):
    """Name every tensor leaf of a reference's return value: out, out.0, out.1, out.<key>.

    Tuples and lists are indexed, dicts (and dict-like model outputs) keyed; a None inside a
    container is skipped (modules often return `(out, None)`), and so is a transformers cache (a
    model's `past_key_values`: state, not an output); anything else is an OutputError.
    """
    leaves = []
    _walk(out, prefix, backend, leaves)
    if not leaves:
        raise OutputError("the reference returned no tensors")
    return leaves


def _is_cache(value) -> bool:
    """A transformers `Cache` (looked up only where transformers is already imported)."""
    cache = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    return cache is not None and isinstance(value, cache)


def _walk(value, name, backend, leaves):
    """Add the tensor leaves of `value` to `leaves`. A function of the module, not a closure: a
    recursive closure is a reference cycle (it holds itself, and `leaves`), which kept every
    evaluation's outputs alive until Python's cycle collector ran — 3 payloads more per nudged
    evaluation, never given back in time. A transformers cache inside the value (a model's
    `past_key_values`) is state, not an output: left out."""
    if backend.is_tensor(value):
        leaves.append((name, value))
    elif _is_cache(value):
        return
    elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        for key in value.keys():
            _walk(value[key], f"{name}.{key}", backend, leaves)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            if item is not None:
                _walk(item, f"{name}.{i}", backend, leaves)
    elif value is None:
        raise OutputError(f"`{name}` is None where a tensor was expected")
    else:
        raise OutputError(
            f"`{name}` is a {type(value).__module__}.{type(value).__qualname__} ({value!r:.60}) "
            f"where a {backend.name} tensor was expected; return a tensor, a tuple/list of "
            "tensors, or a dict of tensors"
        )
