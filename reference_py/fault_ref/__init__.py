"""Deliberately faulty references: the framework's own tests show that each fault ends in a clear
failure (never a pass, a hang or a leaked process). Not part of the installed package."""

import torch


def identity(x):
    return x.clone()


def raises(x):
    if x.shape[-1] >= 3:
        raise ValueError(f"refusing a last dim of {x.shape[-1]}")
    return x.clone()


def returns_float(x):
    return float(x.sum())


def returns_none(x):
    return None


def returns_pair(x):
    return x.clone(), x * 2


def returns_dict(x):
    return {"double": x * 2, "half": x / 2}


def returns_list_of_str(x):
    return [x, "not a tensor"]


def two_outputs_wrong_dtype(x):
    return x.to(torch.float64)


def not_callable_value():
    return None


NOT_CALLABLE = 42
