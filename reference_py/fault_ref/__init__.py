"""Deliberately faulty references: the framework's own tests show that each fault ends in a clear
failure (never a pass, a hang or a leaked process). Not part of the installed package."""

import os
import signal
import subprocess
import sys
import tempfile
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


def segfaults_in_float64(x):
    """Crashes only when golden evaluates it in float64 (a kernel that has no float64 version)."""
    if x.dtype == torch.float64:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x.clone()


def exits_in_float64(x):
    """Ends the interpreter only when golden evaluates it in float64, as an abort path that a
    float64 kernel takes would: no Python stack is printed."""
    if x.dtype == torch.float64:
        os._exit(3)
    return x.clone()


def killed_in_float64(x):
    """Killed only when golden evaluates it in float64, as the kernel's out-of-memory killer would
    kill a float64 evaluation that takes twice the memory: nothing is printed."""
    if x.dtype == torch.float64:
        os.kill(os.getpid(), signal.SIGKILL)
    return x.clone()


def sleeps_in_float64(x):
    """Hangs only when golden evaluates it in float64."""
    if x.dtype == torch.float64:
        time.sleep(3600)
    return x.clone()


def sleeps(x):
    time.sleep(3600)
    return x.clone()


def takes_its_time(x, delay_file):
    """Sleeps the seconds written in `delay_file` (none when it is missing) on every call: a
    reference whose cases a time budget counts (`tests/budget.rs`)."""
    try:
        with open(delay_file) as f:
            time.sleep(float(f.read()))
    except FileNotFoundError:
        pass
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


# --- references that start processes ---------------------------------------------------------------
# Each records the pids it starts (one a line) in `GOLDEN_FAULT_PIDS`, else in
# `<tmp>/golden-fault-pids-<GOLDEN_PARENT_PID>`, so that the tests can check that none outlives its
# worker. The helpers inherit the worker's stdout and stderr, and a forked copy every descriptor of
# the worker (the protocol's too): they hold its pipes open for as long as they live, an hour unless
# GOLDEN_FAULT_HELPER_SECONDS says otherwise.

HELPER_SECONDS = float(os.environ.get("GOLDEN_FAULT_HELPER_SECONDS", "3600"))


def _record(pid: int) -> None:
    path = os.environ.get("GOLDEN_FAULT_PIDS") or os.path.join(
        tempfile.gettempdir(), f"golden-fault-pids-{os.environ.get('GOLDEN_PARENT_PID', 'none')}"
    )
    with open(path, "a") as f:
        f.write(f"{pid}\n")


def _helper() -> None:
    helper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({HELPER_SECONDS})"])
    _record(helper.pid)


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        time.sleep(HELPER_SECONDS)
        os._exit(0)
    _record(pid)


def forks_then_exits(x):
    _fork()
    os._exit(3)


def spawns_then_exits(x):
    _helper()
    os._exit(3)


def spawns_then_hangs(x):
    _helper()
    time.sleep(3600)
    return x.clone()


def spawns_and_returns(x):
    _helper()
    return x.clone()


def forks_and_returns(x):
    _fork()
    return x.clone()


# --- references that touch the worker's descriptors -------------------------------------------------


def reads_stdin(x):
    """Waits for a line on stdin, as a reference left with a debugging `input()` does."""
    input("press enter: ")
    return x.clone()


def closes_stdin(x):
    sys.stdin.close()
    try:
        os.close(0)
    except OSError:
        pass
    return x.clone()


# --- an answer over the frame limit ------------------------------------------------------------------


def returns_large(x):
    """A float32 output of 2^20 elements (4 MiB): with its float64 value and rounding estimate, an
    answer of 24 MiB. Over a frame limit lowered by GOLDEN_MAX_FRAME, as a huge output is over the
    real one."""
    return torch.ones(1 << 20)


# --- shared memory ----------------------------------------------------------------------------------

_decoys = []


def names_a_bogus_arena(x):
    """Returns its input, after making this worker's answers name, as their shared memory, a file it
    opened (this very source file) where its arena's memfd should be: a corrupt frame. The runtime
    must refuse to read it and say so."""
    from golden_ref import shm

    decoy = open(__file__, "rb")
    _decoys.append(decoy)
    real = shm.WriteArena.describe
    shm.WriteArena.describe = lambda self: {**real(self), "fd": decoy.fileno()}
    return x.clone()


class HostileNames(torch.nn.Module):
    """A module whose names are paths: a parameter named `target` (an absolute path; PyTorch refuses
    only dots in a name) and outputs under the keys `../escaped` and `ok`. Golden must keep every
    file it writes for them inside its own folders."""

    def __init__(self, target):
        super().__init__()
        self.register_parameter(target, torch.nn.Parameter(torch.ones(1)))

    def forward(self, x):
        return {"../escaped": x * 2, "ok": x.clone()}


# --- a checkpoint written over while a check reads it ------------------------------------------------


class RewritesItsCheckpoint(torch.nn.Module):
    """A linear layer whose first forward writes over the checkpoint it is checked with (`path`),
    as a training run saving the file again while the tests run would. `how`: `zeros` keeps the
    file's size and header and zeroes its tensors' bytes (the pages read from then on are zeros);
    `truncate` cuts the file to nothing (a mapped page past the end of a file is SIGBUS); `none`
    leaves it alone. Once per file: `<path>.<how>.done` marks it done."""

    def __init__(self, path: str = "", how: str = "none"):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self._path, self._how = path, how

    def forward(self, x):
        done = f"{self._path}.{self._how}.done"
        if self._how != "none" and not os.path.exists(done):
            open(done, "w").close()
            if self._how == "truncate":
                os.truncate(self._path, 0)
            else:
                with open(self._path, "r+b") as f:
                    header = int.from_bytes(f.read(8), "little")
                    f.seek(8 + header)
                    f.write(bytes(os.path.getsize(self._path) - 8 - header))
        return self.proj(x)
