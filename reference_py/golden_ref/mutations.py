"""Diagnosis by mutating the reference: which common porting mistake, made in which line of the
reference, turns the reference into the port?

When a case fails, the runtime sends the case and the port's outputs (`op: "mutations"`). The worker

1. runs the reference once under a recording `TorchFunctionMode`, which sees every torch call it
   makes (`F.*`, `torch.*`, Tensor methods, inside `nn.Module`s and library code alike), each with
   its call site: the innermost frame that is neither torch's nor golden's (file, bytecode offset),
   shown as `file:line` relative to its import root or site-packages;
2. lists the candidates: per call site, each mutation of the catalogue (:mod:`golden_ref.catalogue`)
   that applies there; the same mutation at every site where it applies at once (`spread`); the
   outputs of two same-shaped calls of one op in one function swapped; and the case's inputs
   transposed or swapped;
3. evaluates each candidate cheaply (the case dtype only) and keeps those that change the output and
   move it toward the port's (less than half the distance);
4. evaluates the `keep` closest of those like a reference (case dtype, float64 and nudged, through
   :func:`golden_ref.evaluate.forward`), so that each has its own rounding estimate.

The runtime then compares the port with each survivor under the check's own tolerance and keeps
those it matches on both the smallest and the first failing case.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import time
import weakref

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from .backends import OutputError, bf16_bits_to_f32, flatten_outputs
from .catalogue import Call, catalogue_for, mutation  # noqa: F401  (mutation: re-exported)
from .evaluate import Case, ReferenceRaised, forward
from .wire import WireTensor

# Ops whose outputs may have been swapped between two calls (SwiGLU's gate and up projections).
SWAPPABLE = frozenset(("linear", "matmul", "conv1d", "conv2d", "bmm"))


def _roots(*paths):
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


_TORCH = _roots(os.path.dirname(torch.__file__))
_GOLDEN = _roots(os.path.dirname(os.path.abspath(__file__)))
# A venv's platstdlib is its own lib/pythonX.Y, which holds site-packages: those are not stdlib.
_STDLIB = _roots(sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"))
_INTERNAL: dict = {}
_MACHINERY = tuple(os.path.join("torch", *p.split("/")) for p in (
    "overrides.py", "nn/functional.py", "functional.py", "_tensor.py", "nn/modules/module.py",
    "utils/_contextlib.py", "_jit_internal.py"))


def _stdlib(real: str) -> bool:
    return real.startswith(_STDLIB) and not any(
        part in ("site-packages", "dist-packages") for part in real.split(os.sep))


def _kind(filename: str) -> int:
    """0: a call site; 1: torch's own code (a site only when no other frame is: a reference that is
    a torch module); 2: golden's and the standard library's, never."""
    found = _INTERNAL.get(filename)
    if found is None:
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        if filename.startswith("<frozen") or real.startswith(_GOLDEN) or _stdlib(real):
            found = 2
        elif real.startswith(_TORCH):
            found = 1
        else:
            found = 0
        _INTERNAL[filename] = found
    return found


def _internal(filename: str) -> bool:
    """torch's own frames, golden's and the standard library's are not call sites."""
    return _kind(filename) != 0


_DISPLAY: dict = {}


def display_path(filename: str) -> str:
    """A path relative to the import root or site-packages it is under, never the machine's."""
    shown = _DISPLAY.get(filename)
    if shown is None:
        real = os.path.realpath(filename)
        best = None
        for entry in sys.path:
            if not entry:
                continue
            root = os.path.join(os.path.realpath(entry), "")
            if real.startswith(root) and (best is None or len(root) > len(best)):
                best = root
        shown = real[len(best):] if best else os.path.basename(real)
        _DISPLAY[filename] = shown
    return shown


class Site:
    """Where the reference calls an op: the innermost frame outside torch and golden."""

    __slots__ = ("key", "op", "file", "line", "function", "callers", "calls", "text")

    def __init__(self, key, op, file, line, function, text=None):
        self.key = key
        self.op = op
        self.file = file
        self.line = line
        self.function = function
        self.callers = []  # chains of callers in other files, see `_callers`
        self.calls = 0
        self.text = text  # the call's source text, when it fits on its line

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


class _Ids:
    """A set of tensors by identity (tensors compare elementwise, so a WeakSet cannot hold them)."""

    def __init__(self):
        self._refs = {}

    def add(self, t):
        if isinstance(t, torch.Tensor):
            self._refs[id(t)] = weakref.ref(t)

    def holds(self, t) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


def _site_of(frame, op: str, sites: dict, callers: bool):
    """The call site of the op being dispatched, registered in `sites` (key -> Site)."""
    start = frame
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        # The reference is torch's own (`torch.nn.LayerNorm`): its innermost torch frame that is
        # not dispatch machinery (the module's forward, not `overrides.py`).
        frame = start
        while frame is not None and (_kind(frame.f_code.co_filename) != 1
                                     or frame.f_code.co_filename.endswith(_MACHINERY)):
            frame = frame.f_back
        if frame is None:
            return None
    code = frame.f_code
    key = f"{code.co_filename}:{frame.f_lasti}:{op}"
    site = sites.get(key)
    if site is None:
        site = Site(key, op, display_path(code.co_filename), frame.f_lineno,
                    f"{code.co_filename}:{code.co_name}:{code.co_firstlineno}",
                    _source_text(frame))
        sites[key] = site
    if callers and len(site.callers) < 8:
        chain = _callers(frame)
        if chain and chain not in site.callers:
            site.callers.append(chain)
    return site


def _source_text(frame):
    """The source of the call the frame is making (`self.gate_proj(x)`), when it is on one line."""
    try:
        positions = list(frame.f_code.co_positions())  # Python 3.11+
        line, end_line, col, end_col = positions[frame.f_lasti // 2]
    except (AttributeError, IndexError, ValueError):
        return None
    if line is None or line != end_line or col is None or end_col is None:
        return None
    text = linecache.getline(frame.f_code.co_filename, line)[col:end_col]
    return text if 0 < len(text) <= 60 else None


def _callers(frame, depth: int = 8) -> tuple:
    """The frames that lead to `frame` from other files (`file:line`, innermost first), without
    torch's, golden's and decorators' (functions defined inside functions: `wrapper`)."""
    out = []
    here = frame.f_code.co_filename
    caller = frame.f_back
    while caller is not None and len(out) < depth:
        code = caller.f_code
        if not (_internal(code.co_filename) or code.co_filename == here
                or "<locals>" in getattr(code, "co_qualname", "")):
            out.append((display_path(code.co_filename), caller.f_lineno))
        caller = caller.f_back
    return tuple(out)


class _Mode(TorchFunctionMode):
    """Sees the reference's torch calls; `on_call(call)` computes each of the ops in `ops`."""

    def __init__(self, ops, on_call, sites, callers=False):
        super().__init__()
        self.ops = ops
        self.on_call = on_call
        self.sites = sites
        self.callers = callers  # record who calls each site (the recording only)
        self.negated = _Ids()
        self.counts = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = getattr(func, "__name__", None)
        if op in ("neg", "__neg__"):
            out = func(*args, **kwargs)
            self.negated.add(out)
            return out
        if op not in self.ops:
            return func(*args, **kwargs)
        site = _site_of(sys._getframe(1), op, self.sites, self.callers)
        if site is None:
            return func(*args, **kwargs)
        index = self.counts.get(site.key, 0)
        self.counts[site.key] = index + 1
        call = Call(func, op, args, kwargs, site, state={"negated": self.negated, "index": index})
        return self.on_call(call)


class Candidate:
    """One mutation to try: of some call sites (`targets`, with a catalogue `mutation` and its
    `label`), an exchange of two sites' outputs (`swap`), or other inputs (`args`); `what`,
    `instead`, `fix` and `where` are the message's words."""

    def __init__(self, key, what, instead, fix, where, targets=None, mutation=None, label=None,
                 swap=None, args=None):
        self.key = key
        self.what = what
        self.instead = instead
        self.fix = fix
        self.where = where
        self.targets = targets  # site keys it mutates
        self.mutation = mutation
        self.label = label
        self.swap = swap  # (site a, site b): their outputs are exchanged
        self.args = args  # mutated inputs

    def case(self, case: Case, ops, sites) -> Case:
        if self.args is not None:
            return case.derived(case.obj, args=self.args)
        return _wrapped(case, lambda: _Session(self, ops, sites))


class _Session:
    """One invocation of the reference under a candidate (a prepass first, for swaps)."""

    def __init__(self, candidate, ops, sites):
        self.candidate = candidate
        self.ops = ops
        self.sites = sites

    def run(self, call_reference, constructing=False):
        c = self.candidate
        if c.swap is None:
            with _Mode(self.ops, self._mutate, self.sites):
                return call_reference()
        if constructing:
            # Swaps are of a forward's calls; running a constructor twice would draw new weights.
            return call_reference()
        outputs = {key: [] for key in c.swap}

        def collect(call):
            out = call.func(*call.args, **call.kwargs)
            if call.site.key in outputs:
                outputs[call.site.key].append(out)
            return out

        with _Mode(self.ops, collect, self.sites):
            call_reference()
        a, b = c.swap

        def exchange(call):
            other = {a: b, b: a}.get(call.site.key)
            index = call.state["index"]
            if other is not None and index < len(outputs[other]):
                out = call.func(*call.args, **call.kwargs)
                swapped = outputs[other][index]
                if isinstance(out, torch.Tensor) and isinstance(swapped, torch.Tensor) and (
                        out.shape == swapped.shape):
                    return swapped.to(out.dtype)
                return out
            return call.func(*call.args, **call.kwargs)

        with _Mode(self.ops, exchange, self.sites):
            return call_reference()

    def _mutate(self, call):
        c = self.candidate
        if call.site.key in c.targets and call.op in c.mutation.ops:
            try:
                applies = c.label in c.mutation.options(call)
            except Exception:
                applies = False
            if applies:
                return c.mutation.apply(call, c.label)
        return call.func(*call.args, **call.kwargs)


def _wrapped(case: Case, session, built=None) -> Case:
    """The case with its reference run through `session()` each time it is called (and, in module
    form, constructed: a mistake in `__init__`, like a rotary base, is a mistake too). Modules it
    constructs are appended to `built`."""
    if case.form == "module":
        cls = case.obj

        class Mutated(torch.nn.Module):
            golden_wrapper = True  # loads the case's state into `inner`, as evaluate's wrappers
            golden_inner = cls

            def __init__(self, *args, **init):
                super().__init__()
                holder = {}

                def build():
                    holder["inner"] = cls(*args, **init)

                session().run(build, constructing=True)
                self.inner = holder["inner"]
                if built is not None:
                    built.append(self)

            def forward(self, *args, **kwargs):
                return session().run(lambda: self.inner(*args, **kwargs))

        obj = Mutated
    else:
        fn = case.obj

        def obj(*args, **kwargs):
            return session().run(lambda: fn(*args, **kwargs))

        obj.golden_inner = fn  # what golden's schedules read the signature of
    return case.derived(obj)


class Recording:
    """The reference's calls, by site, and the candidates they admit."""

    def __init__(self, mutations):
        self.mutations = mutations
        self.ops = frozenset().union(*(m.ops for m in mutations)) | SWAPPABLE
        self.sites = {}
        self.calls = 0
        # (mutation index, label) -> {site key: (what, instead, fix, shown)}
        self.options = {}
        # site key -> output shapes per call, for swaps
        self.shapes = {}
        # Sites called while the reference module was constructed (a rotary base): a mutation
        # there needs the module built anew.
        self.construction = set()
        self.constructing = False

    def session(self):
        return self

    def run(self, call_reference, constructing=False):
        self.constructing = constructing
        try:
            with _Mode(self.ops, self._record, self.sites, callers=True):
                return call_reference()
        finally:
            self.constructing = False

    def _record(self, call):
        out = call.func(*call.args, **call.kwargs)
        call._output = out
        self.calls += 1
        call.site.calls += 1
        if self.constructing:
            self.construction.add(call.site.key)
        if call.op in SWAPPABLE and isinstance(out, torch.Tensor):
            self.shapes.setdefault(call.site.key, []).append(tuple(out.shape))
        for i, m in enumerate(self.mutations):
            if call.op not in m.ops:
                continue
            try:
                labels = m.options(call)
            except Exception:
                continue
            for label in labels:
                at = self.options.setdefault((i, label), {})
                if call.site.key not in at:
                    try:
                        words = m.describe(call, label)
                        shown = m.shown(call)
                    except Exception:
                        continue
                    at[call.site.key] = (*words, shown)
                elif not at[call.site.key][3] and m.shown(call):
                    at[call.site.key] = (*at[call.site.key][:3], True)
        return out

    def candidates(self) -> list:
        out = []
        for (i, label), at in self.options.items():
            m = self.mutations[i]
            if not m.joint:
                for key, (what, instead, fix, _) in at.items():
                    out.append(Candidate(f"{m.key}|{label}|{self._id(key)}", what, instead, fix,
                                         self._where([key]), targets={key}, mutation=m, label=label))
            shown = [key for key, words in at.items() if words[3]]
            if m.joint and shown:
                what, instead, fix, _ = at[shown[0]]
                out.append(Candidate(f"{m.key}|{label}|*", what, instead, fix, self._where(shown),
                                     targets=set(at), mutation=m, label=label))
            elif m.spread and len(at) > 1:
                # Every site at once (a port makes its mistake wherever it uses the op), and every
                # site of one function at once (q, k and v split the same wrong way).
                groups = {}
                for key in at:
                    groups.setdefault(self.sites[key].function, []).append(key)
                spreads = [list(at)] + [g for g in groups.values() if 1 < len(g) < len(at)]
                for keys in spreads:
                    what, instead, fix, _ = at[keys[0]]
                    where = f"all {len(keys)} of its call sites: {self._where(keys)}"
                    tag = "*" if len(keys) == len(at) else "*" + self._id(keys[0])
                    out.append(Candidate(f"{m.key}|{label}|{tag}", what, instead, fix, where,
                                         targets=set(keys), mutation=m, label=label))
        out += self._swaps()
        return out

    def _swaps(self):
        by_function = {}
        for key, shapes in self.shapes.items():
            site = self.sites[key]
            by_function.setdefault((site.function, site.op), []).append(key)
        out = []
        for (_, op), keys in by_function.items():
            for n, a in enumerate(keys):
                for b in keys[n + 1:]:
                    if self.shapes[a] == self.shapes[b]:
                        sa, sb = self.sites[a], self.sites[b]
                        if sa.text and sb.text:
                            what = f"the outputs of `{sa.text}` and `{sb.text}` swapped"
                        else:
                            what = f"the outputs of two {op} calls swapped"
                        out.append(Candidate(
                            f"swap|{op}|{self._id(a)}|{self._id(b)}",
                            what,
                            "each where it is",
                            "the port exchanges these two results (e.g. SwiGLU's gate and up "
                            "projections: silu(gate(x)) * up(x)): check which weight feeds which branch",
                            self._where([a, b]),
                            swap=(a, b)))
        return out

    def _id(self, key):
        site = self.sites[key]
        return f"{site.file}:{site.line}:{key.rsplit(':', 2)[1]}:{site.op}"

    def _where(self, keys) -> str:
        """The sites as `file:line`, and, for a site in a helper (an activation module, a rotary
        function), the lines of model code that call it: the nearest caller in a file where the
        reference calls torch ops too."""
        files = {site.file for site in self.sites.values()}
        places, callers = [], []
        for key in keys:
            site = self.sites[key]
            if site.where not in places:
                places.append(site.where)
            for chain in site.callers:
                caller = next((f"{f}:{line}" for f, line in chain if f in files), None)
                if caller and caller not in callers and caller not in places:
                    callers.append(caller)
        text = _join_places(places)
        if callers:
            text += ", called from " + _join_places(callers[:4])
        return text


def _join_places(places) -> str:
    out, last_file = [], None
    for place in places:
        file, _, line = place.rpartition(":")
        out.append(place if file != last_file else f":{line}")
        last_file = file
    if len(out) > 1:
        return ", ".join(out[:-1]) + " and " + out[-1]
    return out[0]


def _input_candidates(case: Case, names: list) -> list:
    out = []
    names = list(names or [])
    names += [f"#{i}" for i in range(len(names), len(case.args))]
    for i, a in enumerate(case.args):
        shape = a.array.shape
        if len(shape) >= 2 and shape[-1] == shape[-2] and shape[-1] > 1:
            args = list(case.args)
            args[i] = WireTensor(a.dtype, np.ascontiguousarray(np.swapaxes(a.array, -1, -2)))
            out.append(Candidate(
                f"input-transposed|{names[i]}", f"its input `{names[i]}` transposed (last two axes)",
                "as given", f"the port reads `{names[i]}` transposed: use it as laid out "
                            "(PyTorch's [out, in] for a weight), or transpose it back with .t()?",
                "", args=args))
    for i, a in enumerate(case.args):
        for j in range(i + 1, len(case.args)):
            b = case.args[j]
            if a.dtype == b.dtype and a.array.shape == b.array.shape:
                args = list(case.args)
                args[i], args[j] = b, a
                out.append(Candidate(
                    f"inputs-swapped|{names[i]}|{names[j]}",
                    f"its inputs `{names[i]}` and `{names[j]}` swapped", "in order",
                    f"the port uses `{names[i]}` where the reference uses `{names[j]}` and vice "
                    "versa: check the argument order", "", args=args))
    return out


def _as_f64(t: WireTensor) -> np.ndarray:
    if t.dtype == "bf16":
        return bf16_bits_to_f32(t.array).astype(np.float64)
    return np.asarray(t.array).astype(np.float64)


_FAR = 1e15


def distance(leaves, port: dict) -> float:
    """RMS distance between the outputs `leaves` and `port` (name -> WireTensor): NaN matches NaN,
    an infinity only itself; any other non-finite pair, or a shape that differs, is far."""
    total, count = 0.0, 0
    for name, t in leaves:
        p = port.get(name)
        if p is None:
            continue
        a, b = _as_f64(t), _as_f64(p)
        if a.shape != b.shape:
            return float("inf")
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.where(same, 0.0, a - b)
        d = np.where(np.isfinite(d), d, _FAR)
        total += float(np.sum(d * d))
        count += d.size
    return float(np.sqrt(total / count)) if count else 0.0


def _cheap(case: Case, target, candidate, ops, sites):
    """The candidate's outputs in the case dtype only, on fresh copies of the inputs, with the
    reference `target` as built for the recording: the cheap pass that picks the few candidates
    evaluated in full (case dtype, float64, nudged) by `forward`."""
    backend = case.backend
    args = [backend.to_native(WireTensor(a.dtype, a.array.copy())) for a in (candidate.args or case.args)]
    session = _Session(candidate, ops, sites) if candidate.args is None else None
    # The CPU generator only: torch.manual_seed also queues a CUDA re-seed, and on a CUDA build
    # that records a stack trace each time (~1 ms, the cheap pass's largest cost).
    torch.default_generator.manual_seed(case.seed)
    with backend.no_grad():
        if session is None:
            out = target(*args, **case.kwargs)
        else:
            out = session.run(lambda: target(*args, **case.kwargs))
    return [(name, backend.from_native(value, case.dtype)) for name, value in flatten_outputs(out, backend)]


def search(case: Case, port, names=None, keep: int = 6, budget: float = 20.0, perturbations: int = 4,
           only=None):
    """Find the mutations of the reference that move it toward the port on this case.

    `port` holds the port's outputs as (name, WireTensor); `names` the inputs' names. Returns a
    summary (calls, sites, candidates tried, whether the budget of seconds ran out) and, for the
    `keep` closest candidates, (candidate, result of `forward`). With `only` (candidate keys, those
    that matched on another case), just those are evaluated, in full, without the cheap pass."""
    started = time.monotonic()
    recording = Recording(catalogue_for(case.obj))
    built = []
    base = forward(_wrapped(case, recording.session, built), precise=False)
    # The cheap pass reuses the reference as forward() built it (its weights included), unless a
    # mutation is in its constructor.
    target = case.obj if case.form != "module" else (built[-1].inner if built else None)
    port = dict(port)
    base_expected = dict(base["expected"])
    base_distance = distance(base["expected"], port)
    candidates = recording.candidates() + _input_candidates(case, names)
    ops = recording.ops
    if only is not None:
        wanted = [c for c in candidates if c.key in set(only)]
        evaluated = []
        for candidate in wanted:
            try:
                evaluated.append((candidate, forward(candidate.case(case, ops, recording.sites),
                                                     perturbations)))
            except (ReferenceRaised, OutputError):
                continue
        return _summary(recording, candidates, len(wanted), len(wanted), False, started), evaluated
    scored = []
    truncated = False
    tried = 0
    for candidate in candidates:
        if time.monotonic() - started > budget:
            truncated = True
            break
        tried += 1
        try:
            if target is None or (candidate.targets and candidate.targets & recording.construction):
                expected = forward(candidate.case(case, ops, recording.sites), precise=False)["expected"]
            else:
                expected = _cheap(case, target, candidate, ops, recording.sites)
        except Exception:  # a mutated reference that raises cannot be the port
            continue
        moved = distance(expected, base_expected)
        if moved == 0.0:
            continue  # a mutation that changes nothing explains nothing
        d = distance(expected, port)
        if d < 0.5 * base_distance:
            scored.append((d, candidate))
    scored.sort(key=lambda s: s[0])
    evaluated = []
    for d, candidate in scored[:keep]:
        try:
            result = forward(candidate.case(case, ops, recording.sites), perturbations)
        except (ReferenceRaised, OutputError):
            continue
        evaluated.append((candidate, result))
    return _summary(recording, candidates, tried, len(scored), truncated, started), evaluated


def _summary(recording, candidates, tried, close, truncated, started):
    return {
        "calls": recording.calls,
        "sites": len(recording.sites),
        "candidates": len(candidates),
        "tried": tried,
        "close": close,
        "truncated": truncated,
        "seconds": time.monotonic() - started,
    }
