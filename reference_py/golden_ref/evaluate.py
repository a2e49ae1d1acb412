"""Running a reference on one generated case.

Per case the runtime needs three things from the reference:

* `expected`: the reference's output in the case dtype, on exactly the inputs the port got;
* `precise`: the same computation in float64 on the same (already rounded) inputs;
* `own` and `moved`: the size of the rounding error this computation makes in the case dtype,
  element by element. It is measured at a few inputs (and parameters) nudged by one ulp of the case
  dtype: at each, the reference's own error (case dtype against float64: `own`) and the float64
  output's move (`moved`). The RMS over the nudges estimates the error's scale; one sample alone is
  often tiny by chance. Rounding errors are chaotic in the input bits, so each nudge gives a fresh
  sample. The runtime bounds the estimate (`answers/live.rs`): where the two precisions differ by
  far more than rounding explains, the float64 run is not the same computation.

Every evaluation gets fresh copies of the inputs and of the module's parameters: a reference that
modifies its inputs in place (`x.add_(1)`) must not change what the next evaluation sees, and is
reported (`mutated`). The float64 evaluations run under `precision.promoted`, so that a reference's
own upcasts (`.to(torch.float32)`) do not truncate them. With `twice`, the case-dtype evaluation is
repeated and must give the same bits: a reference that draws unseeded noise is not deterministic.

Every case's answer is proven deterministic cheaply (`_confirm`): after the nudged evaluations, the
first evaluation in each precision (the case dtype's and float64's, on the real inputs) is
repeated and must give the same bits. A reference whose answers drift with the number of calls (a
counter, a cache, a buffer that accumulates, noise that begins after a few calls) would otherwise
make the nudged evaluations "move" by the drift, which the estimate takes for rounding. Outputs are
copied when an evaluation returns them: a reference may return a buffer of its own and write it
again on the next call.

A checkpoint's module (`case.shared`: a whole model, built once and shared by the evaluations)
is evaluated fewer times, each whole-model evaluation costing seconds: the case dtype and float64
once each on the real inputs, then the nudged evaluations (`perturbations`: three at size, see
`answers/live.rs` `perturbations`) in the case dtype only, each one's error taken against the
float64 answer at the real inputs, so that a sample holds the reference's rounding and the output's
move under the nudge at once (never less than either; `moved` is then zero). Confirmation repeats
the case dtype's first evaluation only: float64 runs once, so there is no float64 drift for the
nudges to take for rounding, and a case-dtype drift is still caught. Six whole-model evaluations,
one of them in float64, where the general path makes twelve, six of them in float64.

`own_mean`, the nudged errors' signed mean, lets the runtime tell a reference whose own error is
chaotic (its sign and size change from nudge to nudge: rounding, however large) from one whose
error stays put. A reference that computes otherwise under a TorchFunctionMode — the float64 pass
runs under one — shows when the case's last case-dtype evaluation runs under an inert mode
(`_confirm`, `mode_shift`).

The runtime's `compare.rs` turns these into the pass/fail rule; the float64 parts are best effort
(a reference that cannot run in float64 just gets the strict default tolerance).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys

import numpy as np

from .backends import OutputError, flatten_outputs
from .limits import check_answer
from . import checkpointed, schedule
from .precision import promoted
from .tap import recording
from .tracebacks import format_user_traceback
from .wire import FLOAT_DTYPES, WireTensor

UNIT_ROUNDOFF = {"f32": 2.0**-24, "f64": 2.0**-53, "f16": 2.0**-11, "bf16": 2.0**-8}


class ReferenceRaised(Exception):
    """The reference (or its constructor) raised; `phase` says during what."""

    def __init__(self, phase: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.phase = phase
        self.traceback = format_user_traceback(error)


def torch_dtype(torch, name: str):
    return {
        "f32": torch.float32,
        "f64": torch.float64,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
    }[name]


class NotDeterministic(Exception):
    """Two evaluations of the reference on the same inputs gave different outputs."""


class Case:
    """One request: which reference, the inputs as wire tensors, consts, init, seed, dtype."""

    def __init__(self, obj, form, backend, args, kwargs, init, seed, dtype):
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"case dtype {dtype!r} is not a float dtype")
        self.obj = obj
        self.form = form
        self.backend = backend
        self.args = args
        self.kwargs = kwargs
        self.init = init
        self.seed = seed
        self.dtype = dtype
        # Module form: also record every submodule's output (forward hooks), see `_call`.
        self.trace = False
        # Module form: the state_dict to load, by the reference's names (wire tensors in the case
        # dtype): drawn by the runtime or read from a checkpoint. None: the module's own init.
        self.state = None
        # Evaluate twice in the case dtype and require the same bits (see NotDeterministic).
        self.twice = False
        # Module form: (configuration class, its keywords) when the module is built from a
        # configuration object (`config = "transformers.LlamaConfig"(...)`), see `construct`.
        self.config = None
        # A `schedule.Plan`: drive the module through time (a cached decode, a padded batch) instead
        # of one call; see `golden_ref.schedule`.
        self.schedule = None
        # Module form with `weights = "..."`: the checkpoint's state this worker keeps
        # (`golden_ref.states.State`); the module is built from it once and shared by the case's
        # evaluations (see `build_module` and `shared`).
        self.checkpoint = None
        # `around(target, run)` runs `run()`, one whole call of the reference (its driving
        # included), and returns its result: the mutation diagnosis runs it under a mutation.
        self.around = None
        # The diagnosis builds the reference from a changed configuration that may have fewer
        # parameters (a final norm a switch turns off): the state's entries it does not have are
        # left out instead of refused.
        self.partial_state = False
        # Told `(stage, phase)` before each of golden's evaluations of the reference (`case`: in
        # the case dtype, `float64`, `construct`), so that a worker that dies or hangs in one is
        # reported in it, whatever killed it: `golden_ref.worker` sends it to the runtime.
        self.progress = None

    @property
    def shared(self) -> bool:
        """Whether the case's evaluations share one module built from a checkpoint, kept by the
        worker (a whole model), instead of fresh copies of it each: see the module docstring."""
        return self.checkpoint is not None and self.form == "module"

    def derived(self, obj, args=None):
        """The same case for another reference `obj` (a variant, a wrapper) and optionally other
        inputs: the module's state and configuration carry over, tracing and `twice` do not."""
        case = Case(obj, self.form, self.backend, self.args if args is None else args, self.kwargs,
                    self.init, self.seed, self.dtype)
        case.state = self.state
        case.config = self.config
        case.schedule = self.schedule
        case.checkpoint = self.checkpoint
        case.around = self.around
        case.partial_state = self.partial_state
        case.progress = self.progress
        return case


def _progress(case: Case, stage: str, phase: str) -> None:
    """Tell whoever listens (`Case.progress`) which evaluation of the reference comes next."""
    if case.progress is not None:
        case.progress(stage, phase)


def reference_module(module):
    """The reference module inside golden's wrappers (variants, gradients, mutations, which may
    wrap one another), or itself."""
    while getattr(type(module), "golden_wrapper", False):
        module = module.inner
    return module


def reference_class(obj):
    """The reference's class behind golden's wrapper classes (variants, gradients, mutations, which
    may wrap one another), or `obj` itself."""
    while hasattr(obj, "golden_inner"):
        obj = obj.golden_inner
    return obj


def _takes_config_keyword(cls) -> bool:
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "config" in parameters and parameters["config"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def constructor_arguments(case: Case):
    """The positional and keyword arguments the reference module is constructed with: `init`, and
    with a configuration class the object `config_class(**keywords)`, as the constructor's `config`
    keyword when it has one (Hugging Face's modules: `LlamaAttention(config, layer_idx)`), else as
    its first argument."""
    kwargs = dict(case.init)
    if case.config is None:
        return (), kwargs
    config_class, keywords = case.config
    try:
        config = config_class(**keywords)
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(f"constructing its configuration `{config_class.__name__}`", e) from None
    if _takes_config_keyword(reference_class(case.obj)):
        kwargs["config"] = config
        return (), kwargs
    return (config,), kwargs


def construct(case: Case):
    """Construct the reference module under the case seed, in eval mode (module's own dtype)."""
    torch = case.backend.torch
    _progress(case, "construct", "constructing the module")
    case.backend.seed(case.seed)
    args, kwargs = constructor_arguments(case)
    try:
        module = case.obj(*args, **kwargs)
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised("constructing the module", e) from None
    if not isinstance(module, torch.nn.Module):
        raise OutputError(
            f"the module form needs an nn.Module class; calling it returned a {type(module).__name__}"
        )
    return module.eval()


def load_state(module, state, backend, extra_ok: bool = False):
    """Load `state` ((name, wire tensor) pairs, the reference's names) into the reference module.
    Tied parameters appear under each of their names, with equal values. With `extra_ok`, entries
    the module does not have are left out."""
    torch = backend.torch
    inner = reference_module(module)
    have = inner.state_dict()
    wanted = {name: backend.to_native(_copy(t)) for name, t in state if not extra_ok or name in have}
    missing = [n for n in have if n not in wanted]
    extra = [n for n in wanted if n not in have]
    if missing or extra:
        raise OutputError(
            f"the parameters golden drew do not fit the module: missing {missing}, unknown {extra}"
        )
    with torch.no_grad():
        for name, value in have.items():
            value.copy_(wanted[name].to(value.dtype))


@contextlib.contextmanager
def _default_dtype(torch, dtype):
    """torch's default dtype set to `dtype` for the duration (nothing when None)."""
    if dtype is None:
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _computed_buffers(module):
    """The float buffers a module computes and does not keep in its state_dict (non-persistent:
    Llama's rotary `inv_freq`), as (owner, name, tensor)."""
    out = []
    for owner in module.modules():
        for name in getattr(owner, "_non_persistent_buffers_set", ()):
            value = owner._buffers.get(name)
            if value is not None and value.is_floating_point():
                out.append((owner, name, value))
    return out


def build_module(case: Case, dtype: str | None = None):
    """The reference module for one evaluation: constructed under the case seed, with `case.state`
    loaded when given, in eval mode, in `dtype` (default: the case dtype). A checkpoint's module
    (`case.shared`) is built once and kept with the state (:func:`_shared_module`).

    In float16 and bfloat16 it is built the way `from_pretrained(dtype=...)` builds a model for
    inference: constructed with that dtype as torch's default, its state_dict's entries (what a
    checkpoint holds) in that dtype, and the buffers it computes for itself kept in the dtype its
    code gives them — Llama's rotary frequencies, made `.float()`, stay float32. Casting those too
    (`module.to(bfloat16)`) would make the reference's rotary table wrong at long positions, which
    no model loaded for inference is."""
    torch = case.backend.torch
    if case.shared and dtype is None:
        return _shared_module(case)
    name = dtype or case.dtype
    target = torch_dtype(torch, name)
    half = name in ("f16", "bf16")
    with _default_dtype(torch, target if half else None):
        # With a state that replaces every parameter, their random init is wasted time (most of a
        # tiny model's construction, and of the diagnosis, which builds it per mistake); a
        # parameter the state does not hold (one a module leaves out of its state_dict) keeps the
        # value its constructor gives it.
        module = construct(case) if case.state is None else _construct_uninitialised(case)
        if case.state is not None and not _state_covers(module, case.state):
            module = construct(case)
    if case.state is not None:
        load_state(module, case.state, case.backend, extra_ok=case.partial_state)
    if not half:
        return module.to(target)
    computed = _computed_buffers(module)
    module = module.to(target)
    for owner, key, value in computed:
        owner._buffers[key] = value
    return module


def _shared_module(case: Case):
    """The module of a checkpoint's case, built once per (reference, init, config, dtype) and kept
    with the worker's state (one at a time): constructed with its parameters on the meta device
    (no memory, no initialisers run: the checkpoint replaces every one of them), then given the
    checkpoint's tensors as its parameters — views of the mapped files in the file's own dtype,
    never converted here: an evaluation converts them as it reads them
    (`golden_ref.checkpointed`), in eval mode."""
    torch = case.backend.torch
    config = None if case.config is None else (case.config[0], repr(sorted(case.config[1].items())))
    key = (case.obj, repr(sorted(case.init.items())), config, case.dtype)
    modules = case.checkpoint.modules
    if key in modules:
        return modules[key]
    modules.clear()
    target = torch_dtype(torch, case.dtype)
    half = case.dtype in ("f16", "bf16")
    with _default_dtype(torch, target if half else None), checkpointed.parameters_on_meta(torch):
        module = construct(case)
    inner = reference_module(module)
    have = inner.state_dict()
    names = {name for name, _ in case.state}
    missing = [n for n in have if n not in names]
    extra = [n for n in names if n not in have]
    if missing or extra:
        raise OutputError(f"the checkpoint golden resolved does not fit the module: missing {missing}, unknown {extra}")
    # The buffers the module computes take the case dtype (as `build_module` gives them), but in
    # half precision, where they keep their code's dtype; the parameters are still shapes only.
    computed = _computed_buffers(module) if half else []
    module = module.to(target).eval()
    for owner, key_, value in computed:
        owner._buffers[key_] = value
    state = {name: case.backend.to_native(t) for name, t in case.state}
    reference_module(module).load_state_dict(state, strict=True, assign=True)
    left = checkpointed.still_on_meta(reference_module(module))
    if left:
        raise OutputError(f"the checkpoint golden resolved leaves {left} of the module without values")
    modules[key] = module
    return module


def _state_covers(module, state) -> bool:
    """Whether `state` ((name, tensor) pairs) holds every parameter of the module."""
    names = {name for name, _ in state}
    inner = reference_module(module)
    return all(name in names for name, _ in inner.named_parameters(remove_duplicate=False))


def _construct_uninitialised(case: Case):
    """`construct(case)` with the in-place initialisers of parameters (`normal_`, `uniform_`,
    `fill_`, ... on an `nn.Parameter`) turned into no-ops: a whole model's random init takes
    seconds and its memory for values the checkpoint replaces. Buffers are computed as usual
    (a rotary embedding's `inv_freq` is not in the state_dict)."""
    torch = case.backend.torch
    from torch.overrides import TorchFunctionMode

    T = torch.Tensor
    initialisers = {T.normal_, T.uniform_, T.zero_, T.fill_, T.copy_, T.erfinv_, T.mul_, T.add_,
                    T.clamp_, T.exponential_, T.bernoulli_, T.random_, T.cauchy_, T.log_normal_,
                    T.geometric_}

    class SkipInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            # torch.nn.init's functions are dispatched with their tensor as a keyword.
            tensor = args[0] if args else (kwargs or {}).get("tensor")
            # torch.nn.init's functions dispatch to the mode themselves (and what they call then
            # does not reach it): `nn.Linear`'s kaiming_uniform_, transformers' `_init_weights`
            # (which keeps torch's originals while it patches the module's names).
            initialiser = func in initialisers or (
                getattr(func, "__module__", None) == "torch.nn.init" and func.__name__.endswith("_"))
            if initialiser and isinstance(tensor, torch.nn.Parameter):
                return tensor
            return func(*args, **(kwargs or {}))

    with SkipInit():
        return construct(case)


def _versions(module) -> dict:
    """Each parameter's and buffer's in-place version counter (what an in-place write bumps)."""
    inner = reference_module(module)
    return {name: t._version for name, t in inner.state_dict(keep_vars=True).items()}


def _copy(t: WireTensor) -> WireTensor:
    """A private copy: what an evaluation gets, so that in-place changes stay in it."""
    return WireTensor(t.dtype, np.array(t.array, copy=True))


# Bits are compared this many bytes at a time: no copy of a whole (possibly huge) tensor.
_CHUNK = 1 << 20


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bits (NaNs with equal payloads are equal, 0.0 and -0.0 are
    not), compared a chunk at a time without copying either: `tobytes()` of both made two copies
    of every output, twice the payload of a large one at once."""
    if a.shape != b.shape or a.nbytes != b.nbytes:
        return False
    size = a.dtype.itemsize if a.dtype.itemsize == b.dtype.itemsize else 1
    as_bits = np.dtype(f"u{size}") if size in (1, 2, 4, 8) else np.dtype("u1")
    x = np.ascontiguousarray(a).reshape(-1).view(as_bits)
    y = np.ascontiguousarray(b).reshape(-1).view(as_bits)
    step = max(_CHUNK // as_bits.itemsize, 1)
    return all(np.array_equal(x[i:i + step], y[i:i + step]) for i in range(0, x.size, step))


def call(case: Case, target, args, phase: str, grad: bool = False):
    """Call the reference `target` on the native inputs `args` as the case says: once, or driven
    through its schedule (a cached decode, a submodule given what its model builds); returns its
    leaves, (name, native value) pairs, with the trace's when tracing."""
    if case.around is not None:
        return case.around(target, lambda: _call(case, target, args, phase, grad))
    return _call(case, target, args, phase, grad)


def _call(case: Case, target, args, phase: str, grad: bool = False):
    backend = case.backend
    backend.seed(case.seed)
    plan = _plan(case, target, args)
    # The one-shot run of a schedule needs the module as it was before the cached run (and without
    # the trace's hooks: a trace follows the steps).
    pristine = copy.deepcopy(target) if plan is not None and plan.cached and plan.oneshot else None
    recorded = []
    hooks = _trace_hooks(case, target, recorded)
    taps = recording(_tap_recorder(case, recorded)) if case.trace else contextlib.nullcontext()
    leaves = None
    try:
        with (contextlib.nullcontext() if grad else backend.no_grad()), taps:
            if plan is not None:
                # The driver wraps what the reference raises in each call; its own errors (a
                # schedule the reference cannot follow, outputs that are no tensors) stand.
                leaves = schedule.run(case, plan, target, pristine, args,
                                      lambda during, e: ReferenceRaised(f"{phase}, {during}", e))
            else:
                out = target(*args, **case.kwargs)
    except (ReferenceRaised, schedule.ScheduleError):
        raise
    except OutputError:
        if plan is not None:
            raise
        raise ReferenceRaised(phase, sys.exc_info()[1]) from None
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ReferenceRaised(phase, e) from None
    finally:
        for hook in hooks:
            hook.remove()
    if leaves is None:
        leaves = flatten_outputs(out, backend)
    return leaves + _trace_leaves(recorded)


def _plan(case: Case, target, args):
    """The schedule a call follows: the case's, or for a submodule that takes what its model
    builds (`position_embeddings`, a 4-D mask), one model-built forward; None for a plain call."""
    if case.schedule is not None:
        return case.schedule
    torch = getattr(case.backend, "torch", None)
    if torch is None or not isinstance(target, torch.nn.Module) or not schedule.wants_model_inputs(target):
        return None
    if not args or not torch.is_tensor(args[0]) or args[0].dim() < 2:
        return None
    case.schedule = schedule.Plan.single(arg=0, axis=1, length=args[0].shape[1])
    return case.schedule


def _trace_hooks(case: Case, target, recorded: list):
    """With `case.trace`, a forward hook on every submodule of `target` that records its output as
    `trace.<name>` (the state_dict prefix: what candle's VarBuilder paths give), in execution order.
    Outputs are copied when recorded: a later in-place op must not change them."""
    torch = getattr(case.backend, "torch", None)
    if not case.trace or torch is None or not isinstance(target, torch.nn.Module):
        return []
    hooks = []
    for name, module in target.named_modules():
        if not name:
            continue
        # Wrappers (variants, gradients) hold the reference module as `inner`.
        name = name[len("inner."):] if name.startswith("inner.") else name

        def hook(_module, _inputs, output, name=name):
            try:
                leaves = flatten_outputs(output, case.backend, prefix=name)
            except OutputError:
                return  # an output without tensors is not a trace point
            recorded.append([(n, _detached_copy(t)) for n, t in leaves])

        hooks.append(module.register_forward_hook(hook))
    return hooks


def _tap_recorder(case: Case, recorded: list):
    """What `golden_ref.tap(name, value)` records during a traced evaluation: `value` as the trace
    point `name` (a tuple/list/dict as `name.0`, …), in execution order among the submodules'
    outputs, copied like theirs. A value without tensors is an error in the reference, named."""

    def record(name, value):
        try:
            leaves = flatten_outputs(value, case.backend, prefix=name)
        except OutputError as e:
            raise OutputError(f"golden_ref.tap({name!r}, ...): {e}") from None
        recorded.append([(n, _detached_copy(t)) for n, t in leaves])

    return record


def _detached_copy(t):
    return t.detach().clone() if hasattr(t, "detach") else np.array(t, copy=True)


def _trace_leaves(recorded: list):
    """The recorded outputs as leaves `trace.<module>`; a module called again is `<module>#2`."""
    calls = {}
    leaves = []
    for outputs in recorded:
        for name, tensor in outputs:
            calls[name] = calls.get(name, 0) + 1
            suffix = f"#{calls[name]}" if calls[name] > 1 else ""
            leaves.append((f"trace.{name}{suffix}", tensor))
    return leaves


# The stages of a whole model's evaluation a request may stop at (`forward`'s `upto`), in order.
STAGES = ("case", "float64", "nudged")


def forward(case: Case, perturbations: int = 4, precise: bool = True, upto: str | None = None,
            key: str | None = None):
    """Evaluate the reference; returns a dict of lists of (name, WireTensor) and notes.

    `precise=False` skips the float64 and nudged evaluations (the benchmark's transport figures).

    `upto`, for a checkpoint's module (`case.shared`: a whole model, each evaluation seconds): the
    last stage to evaluate, the runtime asking for the next only when the port's comparison needs
    it (`answers/live.rs`, `Stage`): `case`, the case-dtype answer alone (assert_close's bound
    needs nothing more); `float64`, with the float64 answer (the rounding estimate's first sample:
    the reference's own error at the real inputs) and the case dtype again under an inert
    TorchFunctionMode (`_confirm`: the float64 pass runs under one); `nudged`, with the nudged
    evaluations and the confirmation after them, as the whole request always was. Evaluations an
    earlier stage made for the same case (`key`, the runtime's key of the case) are kept with the
    checkpoint's state and not made again."""
    backend = case.backend
    module = None
    state_dict, buffers, aliases, unsaved = [], [], [], []
    if case.form == "module":
        module = build_module(case)
        inner = reference_module(module)
        if case.state is None:
            for name, value in inner.state_dict().items():
                state_dict.append((name, backend.from_native(value, case.dtype)))
        buffers, aliases = module_entries(inner)
        unsaved = unsaved_names(inner, aliases)
    staged = upto in STAGES and case.shared and key is not None
    kept = case.checkpoint.recall(key) if staged else {}

    # An answer over the frame limit is refused from the shapes, before any copy of it.
    limit = lambda leaves: check_answer(leaves, state_dict, case.dtype, precise)  # noqa: E731
    if "expected" in kept:
        expected, mutated = kept["expected"], kept["mutated"]
    else:
        expected, mutated = _evaluate_once(case, module, case.args, f"the forward pass in {case.dtype}", limit)
    if case.twice:
        again, _ = _evaluate_once(case, module, case.args, f"the forward pass in {case.dtype}, again")
        _same_bits(expected, again)

    high, own, moved, own_mean, precise_error, mode_shift = None, None, None, None, None, None
    if staged:
        parts = {"expected": expected, "mutated": mutated}
        if precise and upto != "case":
            if "precise" in kept:
                high, precise_error, mode_shift = kept["precise"], kept["precise_error"], kept["mode_shift"]
            else:
                try:
                    high = _float64(case, module, expected)
                except Exception as e:  # best effort: the runtime falls back to the strict tolerance
                    precise_error = f"{type(e).__name__}: {e}"
                if upto == "float64":
                    mode_shift = _confirm(case, module, expected, high)
            parts.update(precise=high, precise_error=precise_error, mode_shift=mode_shift)
            if upto == "nudged" and high is not None:
                try:
                    own, moved, own_mean = _nudged(case, module, expected, high, perturbations)
                except Exception as e:  # best effort, as above
                    high, precise_error = None, f"{type(e).__name__}: {e}"
                # After the nudged evaluations: an answer that drifts from call to call.
                mode_shift = _confirm(case, module, expected, high)
        case.checkpoint.keep(key, parts)
    elif precise:
        try:
            high = _float64(case, module, expected)
            own, moved, own_mean = _nudged(case, module, expected, high, perturbations)
        except Exception as e:  # best effort: the runtime falls back to the strict tolerance
            high, precise_error = None, f"{type(e).__name__}: {e}"
        mode_shift = _confirm(case, module, expected, high)
    return {
        "state_dict": state_dict,
        "buffers": buffers,
        "aliases": aliases,
        "unsaved": unsaved,
        "expected": expected,
        "precise": high,
        "own": own,
        "moved": moved,
        "own_mean": own_mean,
        "mode_shift": mode_shift,
        "precise_error": precise_error,
        "mutated": mutated,
    }


def unsaved_names(inner, aliases):
    """The names of tied tensors that a checkpoint of the module does not hold: Hugging Face's
    `save_pretrained` leaves out the names a module's `_tied_weights_keys` lists (`lm_head.weight`,
    tied to `model.embed_tokens.weight`), where they are tied in this module (in a group of
    `aliases`). A port that reads one would not load from a real checkpoint."""
    tied = {name for group in aliases for name in group}
    unsaved = []
    for prefix, module in inner.named_modules():
        keys = getattr(module, "_tied_weights_keys", None)
        if isinstance(keys, dict):
            keys = list(keys)
        if not isinstance(keys, (list, tuple)):
            continue
        for key in keys:
            if not isinstance(key, str):
                continue
            name = f"{prefix}.{key}" if prefix else key
            if name in tied and name not in unsaved:
                unsaved.append(name)
    return unsaved


def module_entries(inner):
    """The state_dict's buffers (entries that are not parameters: no gradient, no optimizer step),
    and its groups of names that share one tensor (tied weights, e.g. an LM head tied to the
    embedding)."""
    parameters = {n for n, _ in inner.named_parameters(remove_duplicate=False)}
    buffers = []
    groups = {}
    for name, value in inner.state_dict(keep_vars=True).items():
        if name not in parameters:
            buffers.append(name)
        if value.is_meta:
            # No storage to compare (a checkpoint's module, built on the meta device): tied
            # entries are one tensor object.
            key = ("meta", id(value))
        else:
            key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        groups.setdefault(key, []).append(name)
    return buffers, [names for names in groups.values() if len(names) > 1]


def _fan_ins(inner) -> dict:
    """The fan-in of each weight whose module says how it is read, by state_dict name: a Linear's
    `in_features`, a convolution's input channels per group times its kernel, Hugging Face's
    `Conv1D` (`x @ weight`) its first dimension, and 0 for an embedding's weight (each row is an
    activation of its own). The runtime draws such a weight at unit gain (`answers/params.rs`);
    other weights of two or more dimensions count their last dimension as the fan-in."""
    import math

    import torch.nn as nn

    out = {}
    for name, module in inner.named_modules(remove_duplicate=False):
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() < 2:
            continue
        key = f"{name}.weight" if name else "weight"
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            out[key] = 0
        elif isinstance(module, nn.Linear):
            out[key] = module.in_features
        elif isinstance(module, nn.modules.conv._ConvNd):
            out[key] = (module.in_channels // module.groups) * math.prod(module.kernel_size)
        elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
            out[key] = int(weight.shape[0])
    return out


def param_spec(case: Case, weights: bool = False):
    """What the runtime needs to draw the module's parameters: every state_dict entry with its
    shape, whether it is floating point, a parameter or a buffer, the names it is tied to, and the
    statistics of its initial values (so that a drawn tensor keeps its scale and its domain: a norm
    weight near 1, a running variance positive). Integer entries (BatchNorm's step counter) are
    not drawn: their values come along as they are.

    The module is constructed with its uninitialised memory marked (`_marking_empty`: what
    `torch.empty` returns is NaN, where it would be whatever the allocator hands back — garbage,
    `inf`, values of 1e38): an entry the construction leaves so is `uninitialised` and has no
    statistics (the runtime draws it fresh; transformers 5's bare MoE blocks leave their experts
    and router so). Statistics come from finite values only. Kept as they are (`kept`, with their
    values): frozen parameters (`requires_grad=False`: Whisper's sinusoidal positions) and buffers
    the module computes at init from a formula (not constant, and the same when the module is
    built under another seed): their value is their meaning. A weight whose module says how it is
    read carries its `fan_in` (`_fan_ins`).

    `weights`: the checkpoint gives every parameter its value (`weights = "..."`), so the module is
    built with its trainable parameters on the meta device (`checkpointed.parameters_on_meta`: a
    whole model's random init costs seconds and its size in memory) and they have no statistics:
    only their names and shapes are listed."""
    torch = case.backend.torch
    inner = reference_module(_construct_marking_empty(case, meta=weights))
    buffers, aliases = module_entries(inner)
    fan_ins = _fan_ins(inner)
    frozen = {n for n, p in inner.named_parameters(remove_duplicate=False) if not p.requires_grad}
    state = inner.state_dict()
    other = None  # the module under another seed, built when a buffer needs it
    entries, tensors = [], []
    for name, value in state.items():
        entry = {"name": name, "shape": list(value.shape), "buffer": name in buffers}
        if not value.is_floating_point():
            entry["float"] = False
            entry["value"] = len(tensors)
            tensors.append(case.backend.from_native(value, case.dtype))
            entries.append(entry)
            continue
        entry["float"] = True
        if name in fan_ins:
            entry["fan_in"] = fan_ins[name]
        if value.is_meta:
            entries.append(entry)
            continue
        v = value.detach().to(torch.float64)
        kept = None
        if bool(torch.isnan(v).any()):
            entry["uninitialised"] = True
        elif name in frozen:
            kept = "frozen"
        elif name in buffers and v.numel() > 1 and bool(v.min() != v.max()):
            if other is None:
                other = _construct_marking_empty(case, seed=case.seed ^ 0x5EED_5EED, meta=weights).state_dict()
            if name in other and torch.equal(other[name], value):
                kept = "computed"
        if kept is not None:
            entry["kept"] = kept
            entry["value"] = len(tensors)
            tensors.append(case.backend.from_native(value, case.dtype))
        elif not entry.get("uninitialised"):
            finite = v[torch.isfinite(v)]
            if finite.numel():
                entry.update(
                    mean=float(finite.mean()),
                    std=float(finite.std(unbiased=False)),
                    min=float(finite.min()),
                    max=float(finite.max()),
                )
                if bool((finite > 0).all()) and finite.numel() == v.numel():
                    logs = finite.log()
                    entry.update(log_mean=float(logs.mean()), log_std=float(logs.std(unbiased=False)))
        entries.append(entry)
    spec = {"entries": entries, "aliases": aliases}
    unsaved = unsaved_names(inner, aliases)
    if unsaved:  # only then: the specs of other modules (and their stores) stay what they were
        spec["unsaved"] = unsaved
    return spec, tensors


def _construct_marking_empty(case: Case, seed: int | None = None, meta: bool = False):
    """`construct(case)` (under `seed` instead of the case's when given) with what `torch.empty`
    and its kin return filled with NaN: memory the construction never initialises shows as NaN,
    never as whatever the allocator handed back. `meta`: the trainable parameters on the meta
    device instead (`checkpointed.parameters_on_meta`), nothing marked."""
    torch = case.backend.torch
    from torch.overrides import TorchFunctionMode

    empty = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}

    class MarkEmpty(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in empty and isinstance(out, torch.Tensor) and out.is_floating_point():
                with torch.no_grad():
                    out.fill_(float("nan"))
            return out

    built = case if seed is None else case.derived(case.obj)
    if seed is not None:
        built.seed = seed
    if meta:
        # No marking: it would write every page of the parameters' memory before they go to the
        # meta device (a whole model's worth); a checkpoint gives the parameters their values.
        with checkpointed.parameters_on_meta(torch):
            return construct(built)
    with MarkEmpty():
        return construct(built)


def _evaluate_once(case: Case, module, args, phase: str, limit=None, private: bool = False,
                   under=None):
    """One evaluation in the case dtype on fresh copies of `args` (and of `module`); returns the
    outputs and what the reference changed in place (inputs by position, parameters by name).
    `limit` sees the native outputs first (the frame limit).

    `private`: `args` and `module` are this evaluation's own (made for it and used by nothing
    after it, the nudged evaluations'): they are handed over as they are, without copying them
    again, and nobody asks what was changed in them (`mutated` is empty). `under`: a context the
    reference runs in (`_confirm`'s inert TorchFunctionMode)."""
    backend = case.backend
    _progress(case, "case", phase)
    if private:
        native = [backend.to_native(a) for a in args]
        with _checkpointed(case, module):
            leaves = call(case, module if module is not None else case.obj, native, phase)
        if limit is not None:
            limit(leaves)
        return [(name, backend.from_native(v, case.dtype)) for name, v in leaves], []
    fresh = [_copy(a) for a in args]
    native = [backend.to_native(a) for a in fresh]
    shared = case.shared and module is not None
    if shared:
        # A checkpoint's module is shared by the evaluations: what the reference writes into it in
        # place shows in its version counters instead of a pristine copy.
        target, versions_before = module, _versions(module)
    else:
        target = copy.deepcopy(module) if module is not None else case.obj
    with _checkpointed(case, module), under if under is not None else contextlib.nullcontext():
        leaves = call(case, target, native, phase)
    if limit is not None:
        limit(leaves)
    outputs = _owned_outputs(backend, leaves, case.dtype)
    mutated = []
    for i, (before, now) in enumerate(zip(args, native)):
        after = backend.from_native(now, before.dtype) if backend.is_tensor(now) else None
        if after is not None and (after.dtype, after.array.shape) == (before.dtype, before.array.shape):
            if not _same_array(after.array, before.array):
                mutated.append(f"input {i}")
    if shared:
        after = _versions(module)
        changed = [name for name, v in after.items() if versions_before.get(name) != v]
        mutated.extend(f"parameter {name}" for name in changed)
        if changed:
            # The next evaluation must see the checkpoint again, not what the reference wrote.
            case.checkpoint.reload()
    elif module is not None:
        pristine = reference_module(module).state_dict()
        for name, value in reference_module(target).state_dict().items():
            if name in pristine and not backend.torch.equal(value, pristine[name]):
                mutated.append(f"parameter {name}")
    return outputs, mutated


def _checkpointed(case: Case, module):
    """A case-dtype evaluation of a checkpoint's module (`case.shared`): its tensors converted to
    the case dtype as they are read, its pages given back module by module
    (`checkpointed.evaluating`); nothing for any other module."""
    if not case.shared or module is None:
        return contextlib.nullcontext()
    torch = case.backend.torch
    return checkpointed.evaluating(torch, module, case.checkpoint, torch_dtype(torch, case.dtype))


def _owned_outputs(backend, leaves: list, dtype: str):
    """The outputs as wire tensors of their own, `leaves` emptied on the way (each native output is
    released once copied). A reference may return a buffer it keeps and writes again on its next
    call (`return self._buf.copy_(...)`): an answer that shared its memory would change under the
    evaluations after it, and two of them would always "agree"."""
    outputs = []
    while leaves:
        name, value = leaves.pop(0)
        wire = backend.from_native(value, dtype)
        outputs.append((name, WireTensor(wire.dtype, np.array(wire.array, copy=True))))
        del value, wire
    return outputs


def _confirm(case: Case, module, expected, high):
    """Repeat the case's first evaluation in each precision after all the others (the nudged ones
    in between) and require the same bits: an answer that drifts with the number of calls, or noise
    that begins after a few calls, is not rounding error (see the module docstring). `high`: the
    float64 answer on the real inputs (None when the float64 pass failed).

    The case-dtype repetition runs under a TorchFunctionMode that changes nothing (`_inert`), as
    golden's float64 pass runs under one (`precision.promoted`): a reference that computes
    otherwise when a mode is active (a fast path that checks for one, or one that sniffs golden's
    pass) answers otherwise there. Then it is evaluated once more without the mode: the same bits
    as the first say that the mode made the difference, not noise, and the difference per element
    (`mode_shift`) goes to the runtime, which gives no rounding term where it is more than rounding
    (the float64 pass was another computation there). Returns `mode_shift`, or None."""
    inert = _inert(case.backend)
    again, _ = _evaluate_once(case, module, case.args, f"the forward pass in {case.dtype}, again", under=inert)
    shift = None
    if not all(_same_array(a.array, b.array) for (_, a), (_, b) in zip(expected, again)):
        plain, _ = _evaluate_once(case, module, case.args, f"the forward pass in {case.dtype}, once more")
        _same_bits(expected, plain, "its first and its last evaluation in the case dtype")
        del plain
        shift = [(name, WireTensor("f32", np.abs(_floats(b) - _floats(a)).astype(np.float32).reshape(a.array.shape)))
                 for (name, a), (_, b) in zip(expected, again) if a.dtype in FLOAT_DTYPES]
    del again
    if high is not None and not case.shared:
        names = [name for name, _ in expected]
        leaves = _evaluate64(case, module, case.args, "the float64 evaluation, again")
        _same_bits(high, _float64_leaves(case.backend, leaves, names), "its first and its last evaluation in float64")
    return shift


def _inert(backend):
    """A TorchFunctionMode that calls every function as it is (None for the numpy backend)."""
    torch = getattr(backend, "torch", None)
    if torch is None:
        return None
    from torch.overrides import TorchFunctionMode

    class Inert(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return Inert()


def _same_bits(first, second, which: str = "two evaluations"):
    """Raise NotDeterministic, naming the first leaf and element that differ."""
    for (name, a), (_, b) in zip(first, second):
        if not _same_array(a.array, b.array):
            x, y = _floats(a), _floats(b)
            where = next((i for i in range(min(x.size, y.size)) if not _same(x[i], y[i])), 0)
            index = list(np.unravel_index(where, a.array.shape)) if a.array.shape else []
            raise NotDeterministic(
                f"`{name}` differs between {which} on the same inputs, first at "
                f"{[int(k) for k in index]}: {x[where] if x.size else '?'} then "
                f"{y[where] if y.size else '?'}"
            )


def _floats(t: WireTensor) -> np.ndarray:
    if t.dtype == "bf16":
        return (t.array.astype(np.uint32) << 16).view(np.float32).reshape(-1).astype(np.float64)
    return t.array.reshape(-1).astype(np.float64)


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)


_UINT = {"f16": np.uint16, "bf16": np.uint16, "f32": np.uint32, "f64": np.uint64}


def nudge(t: WireTensor, rng: np.random.Generator) -> WireTensor:
    """Move every finite non-zero float by one ulp in the case dtype, up or down at random.

    Adding one to the bit pattern moves a float one ulp away from zero, subtracting one moves it
    toward zero; zeros, infinities and NaNs stay as they are.
    """
    if t.dtype not in FLOAT_DTYPES:
        return t
    bits = t.array.view(_UINT[t.dtype]) if t.dtype != "bf16" else t.array
    magnitude_mask = {2: 0x7FFF, 4: 0x7FFF_FFFF, 8: 0x7FFF_FFFF_FFFF_FFFF}[bits.dtype.itemsize]
    exponent_all_ones = {
        ("f16", 2): 0x7C00,
        ("bf16", 2): 0x7F80,
        ("f32", 4): 0x7F80_0000,
        ("f64", 8): 0x7FF0_0000_0000_0000,
    }[(t.dtype, bits.dtype.itemsize)]
    kind = bits.dtype.type
    magnitude = bits & kind(magnitude_mask)
    # Finite and non-zero: 0 < magnitude < exponent all ones (one unsigned comparison: zero wraps).
    movable = (magnitude - kind(1)) < kind(exponent_all_ones - 1)
    # Stepping up from the largest finite value would reach infinity: step down there instead.
    up = rng.integers(0, 2, size=bits.shape).astype(bool)
    up &= magnitude != kind(exponent_all_ones - 1)
    # +1 or -1 (wrapping) where movable, 0 elsewhere.
    step = np.where(up, kind(1), kind(np.iinfo(kind).max))
    step *= movable
    moved = bits + step
    array = moved if t.dtype == "bf16" else moved.view(t.array.dtype)
    return WireTensor(t.dtype, array.reshape(t.array.shape))


def _evaluate64(case: Case, module, args, phase: str):
    """One float64 evaluation (under `promoted`) on fresh upcast copies of `args`; `module` is the
    case's module in the case dtype, copied and upcast."""
    backend = case.backend
    _progress(case, "float64", phase)
    native = []
    for a in args:
        view = backend.to_native(a)
        upcast = backend.to_float64(view)
        # The upcast is a fresh tensor already, unless there was nothing to convert (an integer
        # input, a float64 case): then the evaluation gets a copy.
        native.append(backend.to_native(_copy(a)) if upcast is view else upcast)
    target = case.obj
    if case.shared and module is not None:
        # No float64 copy of a whole model: its parameters are upcast as each operation reads them
        # (`promoted(upcast=True)`), the largest a slice at a time, and each module's mapped pages
        # go back once it has run (`golden_ref.checkpointed`).
        with checkpointed.evaluating(backend.torch, module, case.checkpoint), checkpointed.float64(backend.torch):
            return call(case, module, native, phase)
    if module is not None:
        target = copy.deepcopy(module).to(backend.torch.float64)
    with promoted(backend):
        return call(case, target, native, phase)


def _nudge_in_place(case: Case, module, rng):
    """A checkpoint's module nudged for one sample, without a copy of it: its small float
    parameters and buffers (at most one axis: norm weights, biases — every layer has some, so the
    nudge reaches every layer's rounding), or every one of them if it has none, get nudged values
    in place of theirs. Returns what to put back: (tensor, its own data)."""
    torch = case.backend.torch
    inner = reference_module(module)
    target = torch_dtype(torch, case.dtype)
    entries = [t for _, t in inner.state_dict(keep_vars=True).items() if t.is_floating_point()]
    small = [t for t in entries if t.dim() <= 1]
    swapped, seen = [], set()
    for t in small or entries:
        if id(t) in seen:
            continue
        seen.add(id(t))
        # In the case dtype: a checkpoint in another (bf16 checked in float32) would nudge by one
        # ulp of its own dtype (256 of float32's), or round a float32 ulp away.
        wire_k = nudge(case.backend.from_native(t.detach().to(target), case.dtype), rng)
        swapped.append((t, t.data))
        t.data = case.backend.to_native(wire_k)
    return swapped


def _module_with_state(module, state: dict, torch):
    copy_ = copy.deepcopy(module)
    with torch.no_grad():
        for name, value in copy_.state_dict().items():
            value.copy_(state[name])
    return copy_


def _float64(case: Case, module, expected):
    """The float64 answer on the real inputs, as (name, float64 wire tensor) per float leaf."""
    names = [name for name, _ in expected]
    leaves64 = _evaluate64(case, module, case.args, "the float64 evaluation")
    # Its own copy where it is the evaluation's output itself (a float64 output that the reference
    # may write again on its next call); a conversion is a copy already.
    return [(n, t if t.array.flags.owndata else WireTensor(t.dtype, np.array(t.array, copy=True)))
            for n, t in _float64_leaves(case.backend, leaves64, names)]


def _nudged(case: Case, module, expected, precise, perturbations: int):
    """The rounding error's samples at `perturbations` nudged inputs (see the module docstring),
    against `precise`, the float64 answer at the real inputs: (own, moved, own_mean)."""
    backend = case.backend
    names = [name for name, _ in expected]
    base64 = {name: t.array for name, t in precise}

    # Samples of the rounding error at inputs one ulp away (see the module docstring), folded in
    # as each nudge's evaluations come (`_Samples`).
    samples = {name: _Samples(t.array.shape) for name, t in precise}
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(perturbations):
            rng = np.random.default_rng([case.seed & 0xFFFF_FFFF_FFFF_FFFF, k])
            # Private to this nudge: the nudged floats are new arrays, the rest are copied.
            args_k = [nudge(a, rng) if a.dtype in FLOAT_DTYPES else _copy(a) for a in case.args]
            module_k = None
            swapped = []
            if module is not None and case.shared:
                module_k = module
                swapped = _nudge_in_place(case, module, rng)
            elif module is not None:
                torch = backend.torch
                state = {}
                for name, value in module.state_dict().items():
                    if value.is_floating_point():
                        wire_k = nudge(backend.from_native(value, case.dtype), rng)
                        state[name] = backend.to_native(wire_k)
                    else:
                        state[name] = value
                module_k = _module_with_state(module, state, torch)
            # float64 first (on copies), so that the case-dtype evaluation can have `args_k` and
            # `module_k` themselves; an error is raised in the former order (the case dtype's first).
            try:
                high, high_error = None, None
                if not case.shared:
                    try:
                        high = _evaluate64(case, module_k, args_k, "a nudged evaluation")
                    except Exception as e:  # noqa: BLE001 - raised below, after the case-dtype evaluation
                        high_error = e
                low, _ = _evaluate_once(case, module_k, args_k, "a nudged evaluation", private=True)
            finally:
                for parameter, value in swapped:
                    parameter.data = value
            del args_k, module_k, swapped
            if high_error is not None:
                raise high_error
            low = dict(low)
            if case.shared:
                # At size the nudged evaluations run in the case dtype only: each one's error is
                # taken against the float64 answer at the real inputs, so that it holds the output's
                # move under the nudge as well as its rounding (never less than either): a sample
                # of the estimate's max(own, moved) for a whole-model evaluation, not three.
                # Its rounding and its move are one sample then, and count as both: the runtime
                # judges an error beyond what the output's move explains as the case dtype's own
                # noise (`answers/live.rs`, `rounding_estimate`), which it is not here.
                high64 = {name: t for name, t in precise}
            else:
                high64 = dict(_float64_leaves(backend, high, names))
            del high
            for name, sample in samples.items():
                sample.add(name, low[name], high64[name].array, base64[name], combined=case.shared)
            del low, high64
    own = [(name, WireTensor("f32", samples[name].own)) for name, _ in precise]
    moved = [(name, WireTensor("f32", samples[name].moved)) for name, _ in precise]
    own_mean = [(name, WireTensor("f32", samples[name].mean)) for name, _ in precise]
    return own, moved, own_mean


class _Samples:
    """One leaf's samples of its rounding error over the nudges, folded in as they come a chunk at a
    time: the running RMS of the reference's own error (case dtype − float64, `own`) and of the
    float64 output's move (`moved`), and the own error's running mean (`mean`) — float32 arrays,
    the answer's three parts themselves. Running RMS needs no squares kept (float32 would overflow
    them), and the chunks no temporaries the size of the output: memory is three float32 copies of
    the leaf, where float64 sums and their temporaries took eleven."""

    def __init__(self, shape):
        self.own = np.zeros(shape, np.float32)
        self.moved = np.zeros(shape, np.float32)
        self.mean = np.zeros(shape, np.float32)
        self.count = 0

    def add(self, name: str, low: WireTensor, high: np.ndarray, base: np.ndarray, combined: bool = False):
        """One nudge's sample. `combined` (a whole model, whose nudged evaluations run in the case
        dtype only: `high` is `base`): the error against the float64 answer at the real inputs
        holds the output's move as well as the rounding, and is taken as both."""
        if low.array.shape != self.own.shape or high.shape != self.own.shape:
            raise ValueError(f"`{name}` changed shape under a one-ulp nudge")
        k = self.count
        self.count += 1
        lows = low.array.reshape(-1)
        highs, bases = high.reshape(-1), base.reshape(-1)
        own, moved, mean = self.own.reshape(-1), self.moved.reshape(-1), self.mean.reshape(-1)
        step = max(_CHUNK // 8, 1)
        for i in range(0, lows.size, step):
            j = min(i + step, lows.size)
            e = _floats(WireTensor(low.dtype, lows[i:j]))
            d = e - highs[i:j]  # the reference's rounding error there
            m = d if combined else highs[i:j] - bases[i:j]  # the output's sensitivity to the nudge
            own[i:j] = np.sqrt((np.square(own[i:j], dtype=np.float64) * k + d * d) / (k + 1))
            moved[i:j] = np.sqrt((np.square(moved[i:j], dtype=np.float64) * k + m * m) / (k + 1))
            mean[i:j] = (mean[i:j].astype(np.float64) * k + d) / (k + 1)


def variants(case: Case, perturbations: int = 4):
    """Evaluate the reference's registered variants on the case, each as a reference in its own
    right: in the case dtype, in float64 and nudged, so that its rounding is estimated too.

    Returns (name, fix, result of `forward` or None, error or None) per variant; a variant that
    raises on this case cannot match and is reported with its error.
    """
    from .variants import variants_for

    out = []
    for v in variants_for(case.obj):
        if case.form == "module":
            obj = _variant_module(case.obj, v.fn)
        else:
            obj = v.fn
        vcase = case.derived(obj)
        try:
            out.append((v.name, v.fix, forward(vcase, perturbations), None))
        except (ReferenceRaised, OutputError) as e:
            out.append((v.name, v.fix, None, str(e)))
    return out


def gradient_case(case: Case, names: list, wrt: list, params: bool, along: dict | None = None) -> Case:
    """The case of the function (inputs, cotangents) -> gradient of sum(out * cotangent), as a
    reference of its own: golden evaluates it like any reference (case dtype, float64, nudged), so
    gradients get a rounding estimate too.

    `case.args` holds the inputs, then one cotangent per output leaf. `wrt` indexes the inputs to
    differentiate; `params` adds the module's parameters. Leaves are named by argument or parameter;
    a gradient PyTorch does not produce (no dependence) is left out.

    `along` (`{"names": [...], "at": k}`: a layer at size, whose gradients are millions of values):
    `case.args[k:]` holds one direction per named target, and each leaf is the gradient's
    derivative along it, `<gradient, direction>` — gradcheck's fast mode, vᵀJu — summed in float64
    and given in the gradient's dtype, instead of the gradient itself; the other targets are left
    out.
    """
    torch = case.backend.torch
    n_inputs = len(names)
    end = along["at"] if along else None
    directions = {name: k for k, name in enumerate(along["names"])} if along else None

    def gradients(call, args, parameters):
        with torch.enable_grad():
            inputs = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args[:n_inputs])]
            cotangents = args[n_inputs:end]
            leaves = flatten_outputs(call(*inputs), case.backend)
            if len(leaves) != len(cotangents):
                raise ValueError(f"{len(leaves)} outputs for {len(cotangents)} cotangents")
            total = sum((leaf * c).sum() for (_, leaf), c in zip(leaves, cotangents))
            targets = [(names[i], inputs[i]) for i in wrt] + list(parameters)
            grads = torch.autograd.grad(total, [t for _, t in targets], allow_unused=True)
        if directions is None:
            return {name: g for (name, _), g in zip(targets, grads) if g is not None}
        out = {}
        for (name, _), g in zip(targets, grads):
            if g is not None and name in directions:
                u = args[end + directions[name]]
                out[name] = (g.to(torch.float64) * u.to(torch.float64)).sum().to(g.dtype)
        return out

    if case.form == "module":
        cls = case.obj

        class GradientOf(torch.nn.Module):
            golden_wrapper = True
            golden_inner = cls

            def __init__(self, *args, **init):
                super().__init__()
                self.inner = cls(*args, **init)

            def forward(self, *args, **kwargs):
                parameters = self.inner.named_parameters() if params else []
                return gradients(lambda *a: self.inner(*a, **kwargs), args, parameters)

        obj = GradientOf
    else:
        fn = case.obj

        def obj(*args, **kwargs):
            return gradients(lambda *a: fn(*a, **kwargs), args, [])

    return case.derived(obj)


def _variant_module(cls, fn):
    """A module-form variant as a module: built like the reference (same seed, same weights), its
    forward is `fn(reference_module, *args)`."""
    import torch

    class VariantOf(torch.nn.Module):
        golden_wrapper = True
        golden_inner = cls

        def __init__(self, *args, **init):
            super().__init__()
            self.inner = cls(*args, **init)

        def forward(self, *args, **kwargs):
            return fn(self.inner, *args, **kwargs)

    return VariantOf


def _float64_leaves(backend, leaves, names):
    if [name for name, _ in leaves] != names:
        raise ValueError("the float64 evaluation returned other outputs than the case dtype one")
    out = []
    for name, value in leaves:
        wire = backend.to_float64_wire(value)
        if wire is None:  # integer/bool leaves are compared exactly; no precise version needed
            continue
        out.append((name, wire))
    return out
