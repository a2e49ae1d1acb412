"""Deliberately faulty references: the framework's own tests show that each fault ends in a clear
failure (never a pass, a hang or a leaked process). Not part of the installed package."""

import os
import signal
import sys
import time

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


def exits(x):
    """Ends the interpreter without unwinding, as a C extension's abort path would."""
    os._exit(3)


def segfaults(x):
    os.kill(os.getpid(), signal.SIGSEGV)


def sleeps(x):
    time.sleep(3600)
    return x.clone()


def prints(x):
    print("a reference that prints to stdout " * 100)
    sys.stdout.flush()
    os.write(1, b"and writes to fd 1 directly\n" * 100)
    return x.clone()


def floods_stderr(x):
    sys.stderr.write("noise on stderr " * (4 << 20 >> 4))  # 4 MiB
    sys.stderr.flush()
    return x.clone()


def returns_nan(x):
    y = x.clone()
    y[..., 0] = float("nan")
    return y


def returns_wrong_shape(x):
    return x.reshape(-1)


def returns_dict_without_half(x):
    return {"double": x * 2}


class HostileNames(torch.nn.Module):
    """A module whose names are paths: a parameter named `target` (an absolute path; PyTorch refuses
    only dots in a name) and outputs under the keys `../escaped` and `ok`. Golden must keep every
    file it writes for them inside its own folders."""

    def __init__(self, target):
        super().__init__()
        self.register_parameter(target, torch.nn.Parameter(torch.ones(1)))

    def forward(self, x):
        return {"../escaped": x * 2, "ok": x.clone()}
