"""Diagnosis by mutating the reference: which porting mistake, made in which line of the reference,
turns the reference into the port?

When a case fails, the runtime sends the case and the port's outputs (`op: "mutations"`). The worker

1. runs the reference once under a recording `TorchFunctionMode`, which sees every torch call it
   makes (`F.*`, `torch.*`, Tensor methods, inside `nn.Module`s and library code alike), each with
   its call site (:mod:`golden_ref.sites`), the submodule it runs in, and, for elementwise ops, the
   one tensor it is a formula of (`Flow`); and with hooks on the reference module's submodules
   (:mod:`golden_ref.structure`);
2. lists the candidates: per call site, each mutation of the operator-level families
   (:mod:`golden_ref.families`) and of the catalogue (:mod:`golden_ref.catalogue`) that applies
   there; the same mutation at every site where it applies at once (`spread`); the outputs of two
   same-shaped calls of one op in one function swapped; the structural mistakes of the submodule
   calls; and the case's inputs transposed or swapped;
3. orders them by the failure's evidence (a port whose values are the reference's permuted tries
   axes first, one that differs only at some positions boundaries first, one scaled constants
   first; the submodule where a trace saw the first divergence before the rest), and evaluates
   each cheaply (the case dtype only), keeping those that change the output, leave alone the
   leaves the port already matches, and move it toward the port's (less than half the distance);
4. evaluates the `keep` closest of those like a reference (case dtype, float64 and nudged, through
   :func:`golden_ref.evaluate.forward`), so that each has its own rounding estimate.

All of it within `budget` seconds: the cheap pass stops early enough for the full evaluations, and
the summary says how many candidates of which kind were tried, and whether time ran out.

The runtime then compares the port with each survivor under the check's own tolerance and keeps
those it matches on two failing cases.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import sys
import time
import weakref

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from . import configs, rewrites, structure  # noqa: F401  (rewrites: registers its mutations)
from .backends import OutputError, bf16_bits_to_f32
from .catalogue import CATALOGUE, Call, mutation  # noqa: F401  (mutation: re-exported)
from .evaluate import UNIT_ROUNDOFF, Case, ReferenceRaised, call, construct, forward, reference_class, reference_module
from .families import CASTS, ELEMENTWISE, NONLINEAR
from .sites import INTERNAL as _INTERNAL  # noqa: F401  (tests mark their own file internal)
from .sites import join_places, site_of
from .wire import WireTensor

# Ops whose outputs may have been swapped between two calls (SwiGLU's gate and up projections).
SWAPPABLE = frozenset(("linear", "matmul", "conv1d", "conv2d", "bmm"))
_ADDS = frozenset(("add", "__add__", "__radd__", "add_", "__iadd__"))

# The kinds of candidate, in the order they are tried when the evidence says nothing in particular.
KINDS = ("catalogue", "yours", "config", "activation", "drop", "constant", "axes", "precision", "operands",
         "boundary", "structure", "inputs")


def mechanisms() -> tuple:
    """Every mechanism of the diagnosis, by the name a candidate's key starts with: the catalogue's
    and the families' mutations, the structural plans, configuration changes, the inputs' and
    outputs' exchanges, and the mistakes of driving a schedule (the book's table lists each,
    `tests/test_docs.py`)."""
    from .schedule import MISTAKES

    return (tuple(m.key for m in CATALOGUE) + structure.PLAN_KINDS
            + ("config", "outputs-swapped", "input-transposed", "inputs-swapped") + MISTAKES)


def catalogue_for(reference) -> list:
    """The mutations to try on a reference: the catalogue's named mistakes, then the operator-level
    families, then those a user registered (for every reference or for this one), whatever order
    their modules were imported in."""
    def group(m):
        return 0 if m.kind == "catalogue" else 2 if m.kind == "yours" else 1

    return sorted((m for m in CATALOGUE if m.of is None or m.of is reference), key=group)


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


class Flow:
    """Which tensor an elementwise op's output is a formula of: `x * sigmoid(1.702 * x)` is a chain
    of elementwise ops whose tensors all derive from `x` alone (scalars and 0-d tensors aside). A site ends a chain when some output of it is not
    consumed by a further op of the same chain (`ends`, complete after `finish`)."""

    def __init__(self):
        self._roots = {}  # id(output) -> (ref to output, ref to root, (ops, nonlinear), site key or None)
        self.ends = {}  # site key -> whether some output of it ended a chain

    def _root(self, t):
        found = self._roots.get(id(t))
        if found is not None and found[0]() is t:
            return found
        return None

    def _inputs(self, call):
        return call.args[:1] if call.op in CASTS else list(call.args) + list(call.kwargs.values())

    def before(self, call):
        """(ref to root, ops, nonlinear ops) for an elementwise call of one tensor, or None: `ops`
        counts the chain's ops but casts, `nonlinear` those that are not affine."""
        if call.op not in ELEMENTWISE:
            return None
        root, ops, nonlinear = None, 0, 0
        for a in self._inputs(call):
            if not isinstance(a, torch.Tensor) or a.dim() == 0:
                continue
            if not a.is_floating_point():
                return None
            found = self._root(a)
            r, n, k = (found[1](), found[2][0], found[2][1]) if found is not None else (a, 0, 0)
            if r is None or (root is not None and r is not root):
                return None
            root, ops, nonlinear = r, max(ops, n), max(nonlinear, k)
        if root is None:
            return None
        ops += call.op not in CASTS
        nonlinear += call.op in NONLINEAR
        return weakref.ref(root), ops, nonlinear

    def after(self, call, chain, out):
        if chain is None or not isinstance(out, torch.Tensor):
            return
        for a in self._inputs(call):
            found = self._root(a) if isinstance(a, torch.Tensor) else None
            if found is not None and found[3] is not None:
                self._roots[id(a)] = (*found[:3], None)  # consumed within its chain
        key = call.site.key if call.site is not None else None
        old = self._roots.get(id(out))
        if old is not None and old[3] is not None and old[0]() is not out:
            self.ends[old[3]] = True  # its tensor is gone, never consumed
        self._roots[id(out)] = (weakref.ref(out), chain[0], chain[1:], key)
        if key is not None:
            self.ends.setdefault(key, False)

    def finish(self):
        for _, _, _, key in self._roots.values():
            if key is not None:
                self.ends[key] = True


class _Mode(TorchFunctionMode):
    """Sees the reference's torch calls; `on_call(call)` computes each of the ops in `ops`."""

    def __init__(self, ops, on_call, sites, callers=False, sizes=(), recorder=None):
        super().__init__()
        self.ops = ops
        self.on_call = on_call
        self.sites = sites
        self.callers = callers  # record who calls each site (the recording only)
        self.negated = _Ids()
        self.counts = {}
        self.flow = Flow()
        self.sizes = sizes
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = getattr(func, "__name__", None)
        if op in ("neg", "__neg__"):
            out = func(*args, **kwargs)
            self.negated.add(out)
            return out
        if op not in self.ops:
            return func(*args, **kwargs)
        site = site_of(sys._getframe(1), op, self.sites, self.callers)
        if site is None:
            return func(*args, **kwargs)
        if self.recorder is not None:
            current = self.recorder.current()
            if current is not None:
                site.modules.add(current)
        index = self.counts.get(site.key, 0)
        self.counts[site.key] = index + 1
        call = Call(func, op, args, kwargs, site,
                    state={"negated": self.negated, "index": index, "sizes": self.sizes})
        chain = self.flow.before(call)
        call.state["chain"] = chain
        out = self.on_call(call)
        self.flow.after(call, chain, out)
        return out


class Candidate:
    """One mutation to try: of some call sites (`targets`, with a catalogue `mutation` and its
    `label`), an exchange of two sites' outputs (`swap`), a structural `plan`, or other inputs
    (`args`); `what`, `instead`, `fix`, `where` and `code` (the reference's source line) are the
    message's words, `kind` its family."""

    def __init__(self, key, what, instead, fix, where, targets=None, mutation=None, label=None,
                 swap=None, args=None, kind="catalogue", code=None, plan=None, modules=(), config=None):
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
        self.kind = kind
        self.code = code
        self.plan = plan  # a structure.Plan
        self.modules = set(modules)  # the submodules its sites run in
        self.config = config  # a configs.Change: the reference built from another configuration

    def case(self, case: Case, ops, sites, sizes) -> Case:
        if self.args is not None:
            return case.derived(case.obj, args=self.args)
        if self.config is not None:
            return _configured(case, self.config)
        return _wrapped(case, lambda: _Session(self, ops, sites, sizes))


def _ops_of(candidate, ops, sites) -> frozenset:
    """The ops a candidate's session must see: those of the sites it mutates (a call site is
    worked out from the Python stack, the largest cost of running a mutant), the negations a
    rotation's pattern reads, and, for a formula's replacement or a pattern spread over several
    calls, every elementwise op (the formula a call ends is followed through them)."""
    c = candidate
    if c.plan is not None:
        return _ADDS
    keys = set(c.targets or ()) | set(c.swap or ())
    if not keys:
        return ops
    narrowed = {sites[k].op for k in keys if k in sites} | {"neg", "__neg__"}
    if c.mutation is not None:
        narrowed |= c.mutation.ops
        if c.kind == "activation" or c.mutation.joint:
            narrowed |= ELEMENTWISE
    return frozenset(narrowed) & ops


class _Session:
    """One invocation of the reference under a candidate (a prepass first, for swaps)."""

    def __init__(self, candidate, ops, sites, sizes=()):
        self.candidate = candidate
        self.ops = _ops_of(candidate, ops, sites)
        self.sites = sites
        self.sizes = sizes

    def _mode(self, on_call):
        return _Mode(self.ops, on_call, self.sites, sizes=self.sizes)

    def run(self, call_reference, constructing=False, root=None):
        c = self.candidate
        if c.plan is not None:
            if constructing:
                return call_reference()
            with structure.Applying(root, c.plan) as applying:
                def on_call(call):
                    out = applying.on_call(call) if call.op in _ADDS else None
                    return out if out is not None else call.func(*call.args, **call.kwargs)

                with self._mode(on_call):
                    return call_reference()
        if c.swap is None:
            with self._mode(self._mutate):
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

        with self._mode(collect):
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

        with self._mode(exchange):
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

                watch = getattr(session(), "watch_config", None)
                if watch is not None:
                    args, init = watch(args, init)

                def build():
                    holder["inner"] = cls(*args, **init)

                session().run(build, constructing=True)
                self.inner = holder["inner"]
                if built is not None:
                    built.append(self)

            def forward(self, *args, **kwargs):
                return self.inner(*args, **kwargs)

        derived = case.derived(Mutated)
        # The whole call runs in the session: the module's forward and what the driving builds
        # for it from its configuration (a submodule's rotary tables and mask, every step of a
        # schedule), as a whole model's own code would build them. Inside a mutation made before
        # (a second mistake on top of a first), both apply.
        before = case.around

        def around(target, run):
            inner = run if before is None else (lambda: before(target, run))
            return session().run(inner, root=reference_module(target))

        derived.around = around
        return derived
    else:
        fn = case.obj

        def obj(*args, **kwargs):
            return session().run(lambda: fn(*args, **kwargs))

        obj.golden_inner = fn  # what golden's schedules read the signature of
    return case.derived(obj)


class _ConfigBuilder:
    """A configuration class as `evaluate.constructor_arguments` calls it, building the
    configuration with one change (`configs.Change`)."""

    def __init__(self, config_class, change):
        self.config_class = config_class
        self.change = change
        self.__name__ = getattr(config_class, "__name__", "config")

    def __call__(self, **keywords):
        return self.change.build(self.config_class, keywords)


def _configured(case: Case, change) -> Case:
    """The case with its reference built from the configuration with `change`."""
    derived = case.derived(case.obj)
    config_class, keywords = case.config
    derived.config = (_ConfigBuilder(config_class, change), keywords)
    derived.partial_state = True
    if case.schedule is not None:
        # What the driving builds from the configuration once per case (a submodule's rotary
        # embedding) is built again from this one; the tokens a generation was fed stay.
        derived.schedule = copy.copy(case.schedule)
        derived.schedule.rotary = None
    return derived


def _fits(case: Case) -> bool:
    """Whether the case's state fits the module the case builds: the same names and shapes,
    worked out on torch's meta device (no memory, no initialisation)."""
    if case.state is None or case.form != "module":
        return True
    torch = case.backend.torch
    try:
        with torch.device("meta"):
            module = construct(case)
        have = {name: tuple(t.shape) for name, t in reference_module(module).state_dict().items()}
    except Exception:
        return False
    # Every entry the changed module has, with the case's shape; entries it no longer has (a
    # final norm its configuration turns off) are left out of it.
    wanted = {name: tuple(t.array.shape) for name, t in case.state}
    return all(wanted.get(name) == shape for name, shape in have.items())


class Recording:
    """The reference's calls, by site, and the candidates they admit."""

    def __init__(self, mutations, sizes=()):
        self.mutations = mutations
        self.ops = frozenset().union(*(m.ops for m in mutations)) | SWAPPABLE | ELEMENTWISE | _ADDS
        self.sizes = sizes
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
        self.recorder = None
        self.flow = None
        self.seconds = 0.0
        # The configuration's fields the reference reads (module form built from a configuration).
        self.reads = configs.Reads()

    def session(self):
        return self

    def watch_config(self, args, init):
        """The constructor's arguments with its configuration object watched (`configs.Reads`)."""
        if "config" in init:
            init = {**init, "config": self.reads.watch(init["config"])}
        elif args:
            args = (self.reads.watch(args[0]), *args[1:])
        return args, init

    def config_candidates(self, case: Case) -> list:
        """A candidate per configuration mistake (`configs.changes`) of the fields read, but those
        under which the case's weights no longer fit the module (a size that shapes a weight)."""
        out = []
        for change in configs.changes(self.reads, case.config[0], case.config[1]):
            if not _fits(_configured(case, change)):
                continue
            out.append(Candidate(change.key, change.what(), change.instead(), change.fix(), change.where(),
                                 kind="config", code=change.code(), config=change))
        return out

    def run(self, call_reference, constructing=False, root=None):
        self.constructing = constructing
        started = time.monotonic()
        recorder = structure.Recorder(root) if root is not None and not constructing else None
        mode = _Mode(self.ops, self._record, self.sites, callers=True, sizes=self.sizes, recorder=recorder)
        try:
            if recorder is not None:
                self.recorder = recorder
                with recorder, mode:
                    return call_reference()
            with mode:
                return call_reference()
        finally:
            self.constructing = False
            if not constructing:
                mode.flow.finish()
                self.flow = mode.flow
            self.seconds += time.monotonic() - started

    def _record(self, call):
        out = call.func(*call.args, **call.kwargs)
        call._output = out
        self.calls += 1
        call.site.calls += 1
        if self.constructing:
            self.construction.add(call.site.key)
        if call.op in SWAPPABLE and isinstance(out, torch.Tensor):
            self.shapes.setdefault(call.site.key, []).append(tuple(out.shape))
        if self.recorder is not None and call.op in _ADDS and len(call.args) >= 2:
            self.recorder.on_add(call.site.key, call.args[0], call.args[1], out)
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

    def _wanted(self, m, label, key) -> bool:
        """A formula of one tensor is replaced where it ends, not at each of its steps."""
        if m.kind == "activation" and label.startswith("formula:") and self.flow is not None:
            return self.flow.ends.get(key, True)
        return True

    def candidates(self) -> list:
        out = []
        for (i, label), at in self.options.items():
            m = self.mutations[i]
            at = {k: v for k, v in at.items() if self._wanted(m, label, k)}
            if not at:
                continue
            if not m.joint:
                for key, (what, instead, fix, _) in at.items():
                    out.append(Candidate(f"{m.key}|{label}|{self._id(key)}", what, instead, fix,
                                         self._where([key]), targets={key}, mutation=m, label=label,
                                         kind=m.kind, code=self.sites[key].code,
                                         modules=self.sites[key].modules))
            shown = [key for key, words in at.items() if words[3]]
            if m.joint and shown:
                what, instead, fix, _ = at[shown[0]]
                out.append(Candidate(f"{m.key}|{label}|*", what, instead, fix, self._where(shown),
                                     targets=set(at), mutation=m, label=label, kind=m.kind,
                                     code=self.sites[shown[0]].code if len(shown) == 1 else None))
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
                    # Several lines: the message lists them, and shows none.
                    out.append(Candidate(f"{m.key}|{label}|{tag}", what, instead, fix, where,
                                         targets=set(keys), mutation=m, label=label, kind=m.kind))
        out += self._swaps()
        out += self._structure()
        return out

    def _structure(self):
        if self.recorder is None:
            return []
        adds = {key: (site.where, site.code) for key, site in self.sites.items() if site.op in _ADDS}
        return [Candidate(p.key, p.what, p.instead, p.fix, p.where, kind="structure", code=p.code, plan=p,
                          modules={n for instance in p.instances for n in instance})
                for p in self.recorder.plans(adds)]

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
                            f"outputs-swapped|{op}|{self._id(a)}|{self._id(b)}",
                            what,
                            "each where it is",
                            "the port exchanges these two results (e.g. SwiGLU's gate and up "
                            "projections: silu(gate(x)) * up(x)): check which weight feeds which branch",
                            self._where([a, b]),
                            swap=(a, b), kind="operands", code=sa.code,
                            modules=sa.modules | sb.modules))
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
        text = join_places(places)
        if callers:
            text += ", called from " + join_places(callers[:4])
        return text


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
                "", args=args, kind="inputs"))
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
                    "versa: check the argument order", "", args=args, kind="inputs"))
    return out


def _as_f64(t: WireTensor) -> np.ndarray:
    if t.dtype == "bf16":
        return bf16_bits_to_f32(t.array).astype(np.float64)
    return np.asarray(t.array).astype(np.float64)


_FAR = 1e15
# A mutant within this many units of the case dtype's rounding (at the outputs' size) of the port
# reproduces it; once `_ENOUGH` of them are found, the cheap pass stops.
_EXACT_UNITS = 64
_ENOUGH = 2


def _rms(leaves: dict) -> float:
    """The root mean square of the outputs (finite elements), at least the smallest normal."""
    total, count = 0.0, 0
    for t in leaves.values():
        a = _as_f64(t)
        a = a[np.isfinite(a)]
        total += float(np.sum(a * a))
        count += a.size
    return max(float(np.sqrt(total / count)) if count else 0.0, 1e-30)


def _digest(leaves) -> bytes:
    """The bits of a candidate's outputs, hashed: equal for mutants that compute the same."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in leaves:
        h.update(f"{name}\0{t.dtype}\0{np.shape(t.array)}\0".encode())
        h.update(np.ascontiguousarray(t.array).view(np.uint8).reshape(-1))
    return h.digest()


def _as_port_holds(a: np.ndarray, port_shape) -> np.ndarray:
    """A step's output as a port that returns only the last position holds it (`[b, 1, …]` or
    `[b, …]` of a `[b, t, …]` leaf, as candle-transformers' causal LMs return their logits),
    as the runtime compares them; else unchanged."""
    port_shape = tuple(port_shape)
    if a.shape == port_shape or a.ndim < 2 or a.shape[1] == 0:
        return a
    if port_shape == (a.shape[0], 1, *a.shape[2:]):
        return a[:, -1:]
    if port_shape == (a.shape[0], *a.shape[2:]):
        return a[:, -1]
    return a


def distance(leaves, port: dict) -> float:
    """RMS distance between the outputs `leaves` and `port` (name -> WireTensor): NaN matches NaN,
    an infinity only itself; any other non-finite pair, or a shape that differs, is far."""
    total, count = 0.0, 0
    for name, t in leaves:
        p = port.get(name)
        if p is None:
            continue
        b = _as_f64(p)
        a = _as_port_holds(_as_f64(t), b.shape)
        if a.shape != b.shape:
            return float("inf")
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.where(same, 0.0, a - b)
        d = np.where(np.isfinite(d), d, _FAR)
        total += float(np.sum(d * d))
        count += d.size
    return float(np.sqrt(total / count)) if count else 0.0


def evidence(reference, port: dict) -> list:
    """What the difference between the port and the reference looks like: `permuted` (the port's
    values are the reference's, elsewhere), `local` (whole slices along some axis agree and others
    do not: an edge, a window, a position), `scaled` (the port is the reference times a factor)."""
    found = []
    for name, t in reference:
        p = port.get(name)
        if p is None:
            continue
        q = _as_f64(p)
        r = _as_port_holds(_as_f64(t), q.shape)
        if r.shape != q.shape or r.size < 2 or not (np.isfinite(r).all() and np.isfinite(q).all()):
            continue
        tol = 1e-5 * (1 + np.abs(r))
        differs = np.abs(q - r) > tol
        if not differs.any():
            continue
        if np.allclose(np.sort(q, axis=None), np.sort(r, axis=None), rtol=1e-5, atol=1e-6):
            found.append("permuted")
        for axis in range(r.ndim):
            if r.shape[axis] < 2:
                continue
            other = tuple(k for k in range(r.ndim) if k != axis)
            per_slice = differs.any(axis=other) if other else differs
            if per_slice.any() and not per_slice.all():
                found.append("local")
                break
        rr = float(np.sum(r * r))
        if rr > 0:
            c = float(np.sum(q * r)) / rr
            if abs(c - 1) > 1e-3 and np.sqrt(np.mean((q - c * r) ** 2)) <= 1e-4 * np.sqrt(np.mean(q * q)) + 1e-7:
                found.append("scaled")
    return found


def _agrees(a: WireTensor, b: WireTensor) -> bool:
    """Whether two answers for a leaf are the same but for rounding (a generous bound: this only
    sorts out leaves that plainly agree)."""
    x, y = _as_f64(a), _as_f64(b)
    if x.shape != y.shape:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - y)
        ok = (d <= 1e-4 * (1 + np.abs(y))) | (x == y) | (np.isnan(x) & np.isnan(y))
    return bool(ok.all())


def order_of_kinds(found: list) -> list:
    """The kinds of candidate in the order the evidence suggests."""
    first = []
    if "permuted" in found:
        first += ["axes", "operands", "inputs", "structure"]
    if "local" in found:
        first += ["boundary", "operands", "drop"]
    if "scaled" in found:
        first += ["constant", "drop"]
    # A configuration mistake is tried first whatever the evidence: where one reproduces the port,
    # it is the cause every kind of check names alike (the op it changes differs from check to
    # check; the field does not).
    out = ["config"]
    for kind in first + list(KINDS):
        if kind not in out:
            out.append(kind)
    return out


# Comparisons say a bound as the reference's code says it (`kv_idx <= q_idx`): of the equivalent
# spellings of an off-by-one, they are named first.
_COMPARISONS = frozenset(("le", "lt", "ge", "gt", "__le__", "__lt__", "__ge__", "__gt__", "less", "less_equal",
                          "greater", "greater_equal"))


def _plainer(candidate, recording) -> int:
    """0 for the candidates that name a mistake most plainly among equivalent ones, else 1."""
    targets = candidate.targets or ()
    if candidate.kind == "boundary" and any(recording.sites[k].op in _COMPARISONS for k in targets):
        return 0
    return 1


def _focused(candidate, focus) -> bool:
    """Whether the candidate's sites run in the submodule `focus` (a trace point's name)."""
    if not focus:
        return False
    for name in candidate.modules:
        if name == focus or name.startswith(focus + ".") or focus.startswith(name + "."):
            return True
    return False


def _stepwise(case: Case) -> Case:
    """The case with its schedule's steps only: the cheap pass ranks candidates by the cached
    steps, without the one-shot run of the whole sequence after them (a copy of the module and a
    forward more per candidate, a third of a decode's search)."""
    if case.schedule is None or not case.schedule.oneshot:
        return case
    derived = case.derived(case.obj)
    derived.schedule = copy.copy(case.schedule)
    derived.schedule.oneshot = False
    return derived


def _cheap(case: Case, target, candidate, ops, sites, sizes):
    """The candidate's outputs in the case dtype only, on fresh copies of the inputs, with the
    reference `target` as built for the recording: the cheap pass that picks the few candidates
    evaluated in full (case dtype, float64, nudged) by `forward`."""
    backend = case.backend
    args = [backend.to_native(WireTensor(a.dtype, a.array.copy())) for a in (candidate.args or case.args)]
    session = _Session(candidate, ops, sites, sizes) if candidate.args is None else None
    root = target if isinstance(target, torch.nn.Module) else None
    # The CPU generator only: torch.manual_seed also queues a CUDA re-seed, and on a CUDA build
    # that records a stack trace each time (~1 ms, the cheap pass's largest cost).
    torch.default_generator.manual_seed(case.seed)
    case = _stepwise(case)
    # Driven as the reference is (a schedule's steps, a submodule's position embeddings and mask):
    # a bare call would answer for another computation, or not at all.
    if session is None:
        leaves = call(case, target, args, "the diagnosis's cheap pass")
    else:
        leaves = session.run(lambda: call(case, target, args, "the diagnosis's cheap pass"), root=root)
    return [(name, backend.from_native(value, case.dtype)) for name, value in leaves]


def config_sizes(case: Case) -> list:
    """The integer fields of the case's configuration object (`head_dim`, `query_pre_attn_scalar`,
    …) and `hidden_size / num_attention_heads`, as (name, value): the sizes a constant may be."""
    if case.config is None:
        return []
    config_class, keywords = case.config
    try:
        config = config_class(**keywords)
        items = config.to_dict().items() if hasattr(config, "to_dict") else vars(config).items()
    except Exception:
        return []
    out = []
    for name, value in items:
        if isinstance(value, bool) or not isinstance(value, int) or name.startswith("_"):
            continue
        if name.endswith(("_id", "_ids", "_idx")) or not 2 <= value <= 1 << 20:
            continue
        out.append((name, value))
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        out.append(("hidden_size/num_attention_heads", hidden // heads))
    return out


class Budget:
    """The search's seconds: `reserve` of them kept for the full evaluations."""

    def __init__(self, seconds):
        self.started = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)


def _record(case: Case, sizes, names):
    """Run the reference once under the recording: (the recording, the modules it built, its
    result, the candidates it admits)."""
    recording = Recording(catalogue_for(reference_class(case.obj)), sizes)
    built = []
    result = forward(_wrapped(case, recording.session, built), precise=False)
    recording.reads.stop()
    candidates = recording.candidates() + _input_candidates(case, names)
    if case.config is not None:
        candidates += recording.config_candidates(case)
    return recording, built, result, candidates


@contextlib.contextmanager
def _masks_materialised():
    """transformers' masks built as tensors on every call while the diagnosis runs: where a step has
    no padding it lets the attention kernel imply the causal mask (`is_causal`, no tensor), and
    builds it from `kv_idx <= q_idx` where a step has a cache. A port's mistake in its mask is then
    a mutation of one rule, whatever the step (one diagonal further: the same comparison in a
    prefill and in a chunk on a cache), not of two code paths."""
    masking = sys.modules.get("transformers.masking_utils")
    skip = getattr(masking, "_ignore_causal_mask_sdpa", None)
    if skip is None:
        yield
        return
    masking._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = skip


def search(case: Case, port, names=None, keep: int = 6, budget: float = 20.0, perturbations: int = 4,
           only=None, sizes=(), focus=None, base=None):
    """See `_search`; with transformers' masks materialised (`_masks_materialised`)."""
    with _masks_materialised():
        return _search(case, port, names, keep, budget, perturbations, only, sizes, focus, base)


def _search(case: Case, port, names=None, keep: int = 6, budget: float = 20.0, perturbations: int = 4,
            only=None, sizes=(), focus=None, base=None):
    """Find the mutations of the reference that move it toward the port on this case, within
    `budget` seconds.

    `port` holds the port's outputs as (name, WireTensor); `names` the inputs' names; `sizes` the
    case's named sizes (name, value), to which the configuration's fields are added; `focus` the submodule where a trace saw the first divergence.
    Returns a summary (calls, sites, candidates of each kind and how many were tried, whether the
    budget ran out and where) and, for the `keep` closest candidates, (candidate, result of
    `forward`). With `only` (candidate keys, those that matched on another case), just those are
    evaluated, in full, without the cheap pass. With `base` (a candidate's key), the search is of
    a second mistake on top of that one: every candidate is evaluated with `base` made too (a port
    with two mistakes, the first named on a smaller case)."""
    clock = Budget(budget)
    sizes = [(name, value, "config") for name, value in config_sizes(case)] + [
        (str(n), int(v), "case") for n, v in sizes]
    first = None
    if base is not None:
        recording, _, _, candidates = _record(case, sizes, names)
        first = next((c for c in candidates if c.key == base), None)
        if first is None:
            raise OutputError(f"the mutation {base!r} does not apply to this case")
        case = first.case(case, recording.ops, recording.sites, sizes)
    recording, built, base, candidates = _record(case, sizes, names)
    if first is not None:
        candidates = [c for c in candidates if c.key != first.key]
    # The cheap pass reuses the reference as forward() built it (its weights included), unless a
    # mutation is in its constructor.
    target = case.obj if case.form != "module" else (built[-1].inner if built else None)
    port = dict(port)
    base_expected = dict(base["expected"])
    base_distance = distance(base["expected"], port)
    ops = recording.ops
    # A full evaluation runs the reference 2 + 2 × perturbations times (case dtype, float64, and
    # each nudge in both).
    full_cost = (2 + 2 * perturbations) * max(recording.seconds, 1e-3)
    counts = {}
    for c in candidates:
        counts.setdefault(c.kind, [0, 0])[0] += 1
    if only is not None:
        wanted = [c for c in candidates if c.key in set(only)]
        evaluated, truncated = [], False
        for candidate in wanted:
            if clock.left() <= 0:
                truncated = True
                break
            try:
                evaluated.append((candidate, forward(candidate.case(case, ops, recording.sites, sizes),
                                                     perturbations)))
            except (ReferenceRaised, OutputError):
                continue
        return _summary(recording, candidates, counts, len(evaluated), len(wanted), truncated,
                        "full evaluations" if truncated else None, clock), evaluated
    order = order_of_kinds(evidence(base["expected"], port))
    # Which leaves differ: a mutant that moves a leaf the port already matches is not the port.
    agreed = [name for name, t in base["expected"] if name in port and _agrees(t, port[name])]
    rank = {kind: i for i, kind in enumerate(order)}
    # A configuration is read throughout the model: its mistakes come first with a trace's focus too.
    candidates.sort(key=lambda c: (not (c.kind == "config" or _focused(c, focus)), rank.get(c.kind, len(rank)),
                                   _plainer(c, recording)))
    reserve = min(clock.seconds / 2, keep * full_cost)
    scored = []
    seen = set()
    # What reproducing the port to rounding means here: the case dtype's rounding, a few dozen
    # units at the outputs' size (not a share of how far the port is from the reference: a port
    # far off would make a merely closer mutant "exact").
    exact = _EXACT_UNITS * UNIT_ROUNDOFF.get(case.dtype, 2.0**-24) * _rms(port)
    truncated, stage = False, None
    tried = 0
    for candidate in candidates:
        if clock.left() <= reserve:
            truncated, stage = True, "cheap pass"
            break
        tried += 1
        counts[candidate.kind][1] += 1
        try:
            if (target is None or candidate.config is not None
                    or (candidate.targets and candidate.targets & recording.construction)):
                expected = forward(_stepwise(candidate.case(case, ops, recording.sites, sizes)),
                                   precise=False)["expected"]
            else:
                expected = _cheap(case, target, candidate, ops, recording.sites, sizes)
        except Exception:  # a mutated reference that raises cannot be the port
            continue
        moved = distance(expected, base_expected)
        if moved == 0.0:
            continue  # a mutation that changes nothing explains nothing
        # Two values of one configuration field that compute the same (a key absent and its
        # fallback value) are one mistake: the first named says it. Other mutants that compute
        # the same on this case may not on another (a mask one diagonal further and no mask at
        # all, on two positions): the other failing case tells them apart.
        if candidate.config is not None:
            digest = (tuple(path for path, _ in candidate.config.values), _digest(expected))
            if digest in seen:
                continue
            seen.add(digest)
        if any(not _agrees(t, base_expected[name]) for name, t in expected if name in agreed):
            continue
        d = distance(expected, port)
        if d < 0.5 * base_distance:
            scored.append((d, len(scored), candidate))
        if sum(1 for e, _, _ in scored if e <= exact) >= _ENOUGH:
            # Mutants that are the port to rounding, in the order the evidence ranks the kinds:
            # the rest could only add other spellings of them.
            break
    # Mutants that reproduce the port to rounding, in the order they were tried (the same order
    # in every kind of check, so that one mistake gets one name: configuration first); then the
    # closest of the rest. Among those that reproduce it, which fits best is rounding's choice.
    scored.sort(key=lambda s: (s[0] > exact, s[1] if s[0] <= exact else s[0]))
    evaluated = []
    for d, _, candidate in scored[:keep]:
        if clock.left() <= 0:
            truncated, stage = True, stage or "full evaluations"
            break
        try:
            result = forward(candidate.case(case, ops, recording.sites, sizes), perturbations)
        except (ReferenceRaised, OutputError):
            continue
        evaluated.append((candidate, result))
    return _summary(recording, candidates, counts, tried, len(scored), truncated, stage, clock), evaluated


def _summary(recording, candidates, counts, tried, close, truncated, stage, clock):
    return {
        "calls": recording.calls,
        "sites": len(recording.sites),
        "candidates": len(candidates),
        "tried": tried,
        "close": close,
        "kinds": [[kind, n, t] for kind, (n, t) in sorted(counts.items(), key=lambda kv: KINDS.index(kv[0])
                                                           if kv[0] in KINDS else len(KINDS))],
        "truncated": truncated,
        "stage": stage,
        "seconds": time.monotonic() - clock.started,
        "budget": clock.seconds,
    }

