"""Timing the reference on one case, beside the port: the worker's side of `timing` requests.

Once a forward check's cases pass in a dtype, the runtime times the port and the reference on one
of them (`runtime/src/run/speed.rs`): the same inputs, parameters and dtype. Here the reference:

* its module is built once (the case's parameters loaded, as for its evaluations), before any
  clock starts; each run gets fresh copies of the inputs (and, but for a checkpoint's shared
  module, of the module: a module that keeps state between calls starts each run the same), made
  before its clock starts;
* `warmup` untimed runs, then `runs` timed ones: the time of each call of the reference, under
  `no_grad`, on torch's intra-op threads as golden sets them (one; `threads` says how many);
* a schedule's steps (`decode(...)`): the time of each step's call of the module (`Plan.clock`),
  the one-shot forward of the whole sequence that the comparison also runs left out;
* a traced check's points, in as many runs of their own (the totals come from runs without hooks,
  which cost microseconds each): when each submodule's forward returned (forward hooks) and each
  `golden_ref.tap` was made, since the call began, named as the trace names them;
* peak memory: how much the worker's resident set rose over the timed runs — its peak (VmHWM,
  reset through /proc/self/clear_refs) minus the resident set before them, after glibc's
  `malloc_trim` gave free memory back, so that what the calls allocate shows as new pages. None
  where Linux does not allow it (`memory` says why).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import time

from . import evaluate, schedule
from .backends import OutputError, flatten_outputs
from .evaluate import ReferenceRaised
from .tap import recording

# Errors that say what they are about as they are: not wrapped as the reference raising.
_OWN = (ReferenceRaised, schedule.ScheduleError, OutputError)


def measure(case, warmup: int, runs: int, points: bool) -> dict:
    """Time the reference on `case`: see the module docstring. Returns the answer's header."""
    backend = case.backend
    torch = backend.torch if backend.name == "torch" else None
    module = evaluate.build_module(case) if case.form == "module" else None
    if case.schedule is not None:
        # The one-shot forward is the comparison's, not the model's use.
        case.schedule.oneshot = False

    def prepared():
        if module is None:
            target = case.obj
        elif case.shared:
            target = module
        else:
            target = copy.deepcopy(module)
        native = [backend.to_native(evaluate._copy(a)) for a in case.args]
        return target, native

    totals, steps = [], []
    memory = Memory()
    for i in range(warmup + runs):
        target, native = prepared()
        timed = i >= warmup
        if timed and i == warmup:
            memory.start()
        seconds, run_steps = _run(case, target, native, f"timing run {i + 1}")
        if timed:
            totals.append(seconds)
            steps.append(run_steps)
        del target, native
    peak = memory.stop()

    point_runs = None
    if points and module is not None:
        point_runs = []
        for i in range(warmup + runs):
            target, native = prepared()
            marks = _points(case, target, native, f"traced timing run {i + 1}")
            if i >= warmup:
                point_runs.append(marks)
            del target, native

    return {
        "threads": torch.get_num_threads() if torch is not None else None,
        "totals": totals,
        "steps": steps,
        "points": point_runs,
        "peak_bytes": peak,
        "memory": memory.how,
    }


def _run(case, target, native, phase: str):
    """One call of the reference: its seconds, and a schedule's steps `[k, tokens, seconds]`."""
    backend = case.backend
    backend.seed(case.seed)
    plan = evaluate._plan(case, target, native)
    steps = []
    if plan is not None:
        plan.clock = lambda k, t, started, ended: steps.append([k, t, (ended - started) / 1e9])
    try:
        with backend.no_grad():
            started = time.perf_counter_ns()
            if plan is not None:
                schedule.run(case, plan, target, None, native,
                             lambda during, e: ReferenceRaised(f"{phase}, {during}", e))
            else:
                target(*native, **case.kwargs)
            ended = time.perf_counter_ns()
    except _OWN:
        raise
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(phase, e) from None
    finally:
        if plan is not None:
            plan.clock = None
    return (ended - started) / 1e9, steps


def _points(case, target, native, phase: str):
    """One call with every submodule hooked: `[trace name, seconds since the call began]` of each
    point, in the order they ended."""
    torch = case.backend.torch
    recorded = []
    started = [0]

    def record(name, value):
        at = time.perf_counter_ns()
        try:
            names = [n for n, _ in flatten_outputs(value, case.backend, prefix=name)]
        except OutputError:
            return  # an output without tensors is not a trace point
        recorded.append([(n, (at - started[0]) / 1e9) for n in names])

    hooks = []
    if isinstance(target, torch.nn.Module):
        for name, sub in target.named_modules():
            if not name:
                continue
            name = name[len("inner."):] if name.startswith("inner.") else name
            hooks.append(sub.register_forward_hook(lambda _m, _i, out, name=name: record(name, out)))
    try:
        with recording(record):
            case.backend.seed(case.seed)
            plan = evaluate._plan(case, target, native)
            with case.backend.no_grad():
                started[0] = time.perf_counter_ns()
                if plan is not None:
                        schedule.run(case, plan, target, None, native,
                                 lambda during, e: ReferenceRaised(f"{phase}, {during}", e))
                else:
                    target(*native, **case.kwargs)
    except _OWN:
        raise
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(phase, e) from None
    finally:
        for hook in hooks:
            hook.remove()
    # Named as the trace names them: `trace.<module>`, `#2` for a module that runs again.
    return [[name, seconds] for name, seconds in evaluate._trace_leaves(recorded)]


class Memory:
    """The rise of this process's resident set over a stretch of work, where Linux tells it."""

    def __init__(self):
        self.before = None
        self.how = None

    def start(self):
        # (No gc.collect(): a tenth of a second with torch loaded, and what the runs allocate is
        # freed by reference counting as each run ends.)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError as e:
            self.how = f"the peak resident set cannot be reset here ({e.strerror})"
            return
        self.before = _status("VmRSS")
        if self.before is None:
            self.how = "/proc/self/status has no VmRSS here"

    def stop(self):
        if self.before is None:
            return None
        peak = _status("VmHWM")
        if peak is None:
            self.how = "/proc/self/status has no VmHWM here"
            return None
        return max(peak - self.before, 0)


def _status(field: str):
    """A size from /proc/self/status, in bytes, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
