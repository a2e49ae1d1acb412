"""What a worker can send: every answer is one frame of at most `wire.MAX_FRAME` bytes (2 GiB).

A `forward` answer carries each output leaf in the case dtype and, for float leaves, its float64
value (8 bytes per element) and the three parts of its rounding estimate (4 bytes each): an f32
output of 2^27 elements (512 MiB) makes a 3 GiB answer. :func:`check_answer` refuses such an output as soon as the reference has
returned it, from its shape alone: before it is copied, converted or evaluated again in float64.
"""

from __future__ import annotations

from . import wire

CASE_ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}
# Room for the JSON header and the tensors' own headers.
HEADER_ALLOWANCE = 64 << 10


class AnswerTooLarge(Exception):
    """An answer would exceed the frame limit."""


def size(nbytes: int) -> str:
    """A byte count as messages write it: `4.0 MiB`, `2.05 GiB` (near the limit, two decimals tell
    an answer just over it from the limit)."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / (1 << 10):.1f} KiB"


def _describe(value, case_dtype: str):
    """(wire dtype shown, shape, element count, bytes in the answer, is float) of a native output,
    from its metadata only (an expanded tensor is not materialised)."""
    shape = tuple(int(d) for d in value.shape)
    numel = 1
    for d in shape:
        numel *= d
    if hasattr(value, "is_floating_point"):  # torch
        is_float = bool(value.is_floating_point())
        itemsize = int(value.element_size())
        dtype = str(value.dtype).removeprefix("torch.")
    else:  # NumPy
        is_float = value.dtype.kind == "f"
        itemsize = int(value.dtype.itemsize)
        dtype = str(value.dtype)
    if is_float:
        dtype, itemsize = case_dtype, CASE_ITEMSIZE[case_dtype]
    return dtype, shape, numel, numel * itemsize, is_float


def check_answer(leaves, state_dict, case_dtype: str, precise: bool) -> None:
    """Raise :class:`AnswerTooLarge` if the `forward` answer for these native output leaves (and
    the state_dict, as wire tensors) would exceed the frame limit, naming the largest leaf."""
    total = sum(t.array.nbytes for _, t in state_dict)
    largest = None
    for name, value in leaves:
        dtype, shape, numel, nbytes, is_float = _describe(value, case_dtype)
        # Its float64 value (8 bytes) and the estimate's three float32 halves (own, moved, own_mean).
        extra = 20 * numel if (precise and is_float) else 0
        total += nbytes + extra
        if largest is None or nbytes + extra > largest[0]:
            largest = (nbytes + extra, name, dtype, shape, nbytes, extra)
    if total + HEADER_ALLOWANCE <= wire.MAX_FRAME or largest is None:
        return
    _, name, dtype, shape, nbytes, extra = largest
    with_precise = " with the float64 values and rounding estimates" if extra else ""
    raise AnswerTooLarge(
        f"the reference's output `{name}` ({dtype} {list(shape)}, {size(nbytes)}) is too large to "
        f"send back: the answer would take {size(total)}{with_precise}, over the frame limit of "
        f"{size(wire.MAX_FRAME)}. fix: check the layer on smaller shapes (narrow `dims(...)`); "
        f"golden compares outputs of up to about {size(wire.MAX_FRAME // 6)} in f32"
    )
