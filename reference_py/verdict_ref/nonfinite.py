"""References for tests/verdicts.rs whose outputs are NaN or ±Inf on both sides: NaN matches NaN, so
where no element is finite on both sides the comparison compared nothing (a port off by any factor
gives the same NaN), and where only some are, only those say anything about the port."""

import math

import torch


def times_nan(x):
    """Every element NaN, in every case: a NaN constant (a checkpoint's NaN bias does the same)."""
    return x * math.nan


def times_nan_and_identity(x):
    """Two leaves: `out.0` NaN everywhere, `out.1` the input (finite): the second compares, the
    first compares nothing."""
    return x * math.nan, x


def log(x):
    """NaN where x < 0 (in float32 and float64 alike): partly NaN on both sides."""
    return torch.log(x)
