"""Driving a reference through time: a cached decode, a padded batch, a greedy generation.

A check with a schedule (`decode(...)` on the attribute) asks the worker to run the reference the
way a model is used, not once on a whole sequence:

* the scheduled input (`input_ids`, or hidden states for a submodule) is split along its sequence
  axis into the schedule's chunks — a prefill, then one-token decode steps, or chunks of several
  tokens on a non-empty cache — and the module is called once per chunk with the state it keeps
  between calls: a Hugging Face cache (`past_key_values`, a `DynamicCache` built from the model's
  configuration, as the model builds it itself), or, for a plain `nn.Module`, its own attributes;
* the inputs a model builds for its layers come along at every step, from the same configuration
  and in the same way: `position_ids` (from the attention mask when the batch is padded, as
  `generate` derives them), the 2-D attention mask for a whole model, and for a submodule
  (`LlamaAttention`, `Gemma2DecoderLayer`) its `position_embeddings` from the model family's
  rotary embedding and its 4-D mask from transformers' mask functions (full or sliding, per layer);
* with `generate`, the steps after the prompt feed back the reference's greedy token; the tokens of
  the first evaluation are kept (`Plan.forced`), so that the float64 and nudged evaluations follow
  the same path and the port can be fed the same tokens (teacher forcing);
* after the cached run, a fresh copy of the module runs the whole sequence at once, and its outputs
  at each step's positions are leaves of their own (`oneshot.<k>.…`): a port's cached step is
  judged against both.

Leaves are `step.<k>.<leaf>` (`step.2.out.logits`), `oneshot.<k>.<leaf>` and `tokens`. Outputs at
padded positions are zeros on both sides: only valid positions are compared.

A module whose forward takes `position_embeddings` (a Hugging Face attention or decoder layer) gets
the same model-built inputs in a check without a schedule: one step, no cache, leaves named as
usual.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys

from .backends import flatten_outputs


# Porting mistakes in how a model is driven through time, made in the reference's driving for the
# diagnosis of a failing port (the runtime's `describe/schedule.rs` names them and their fixes):
# position ids that restart at 0 in every call, position ids that count padding, no padding mask,
# both (the padding treated as tokens), no cache, a sliding window one key wider or narrower, a
# sliding window not applied to the cached keys (a cache never trimmed, no mask on a one-token step).
MISTAKES = ("positions-restart", "positions-unpadded", "mask-unpadded", "padding-ignored", "no-cache",
            "window-wider", "window-narrower", "window-uncached", "inputs-reversed", "inputs-ahead")


class ScheduleError(Exception):
    """The reference cannot be driven through the schedule (no cache support, too long for its
    positions, no logits to generate from): a check error, before any step runs."""


class Plan:
    """A request's `schedule`: which input is split along which axis, into which chunks; the
    padding mask of the prompt ([b, n], 1 valid, 0 padding) or None; how many tokens to generate
    greedily after the prompt; and whether the one-shot forward is run too."""

    def __init__(self, spec: dict, mask=None):
        self.arg = int(spec["arg"])
        self.axis = int(spec.get("axis", 1))
        self.chunks = [int(c) for c in spec["chunks"]]
        self.generate = int(spec.get("generate", 0))
        self.oneshot = bool(spec.get("oneshot", True))
        self.cached = bool(spec.get("cached", True))
        # Leaves keep their plain names (`out`): a single model-built forward, no schedule.
        self.plain = bool(spec.get("plain", False))
        # The diagnosis: a porting mistake made in the driving (see MISTAKES), or None.
        self.mistake = spec.get("mistake")
        # A step loop (`steps(...)`): {"per_step": [argument indices], "carry": [[index, leaf]]}.
        self.loop = spec.get("loop")
        # Sampled generation (`decode(generate = N, sample(...))`): {"spec": the sampling
        # parameters, "uniforms": golden's uniforms [b, N], "probe_uniforms": [16]}; the tokens are
        # `generate()`'s, drawn with golden's uniforms (`golden_ref.sampling`).
        self.sample = spec.get("sample")
        # The sampling leaves of the first evaluation (`sample.…`): later ones return the same.
        self.sampled = None
        if self.mistake is not None and self.mistake not in MISTAKES:
            raise ValueError(f"unknown schedule mistake {self.mistake!r}")
        self.mask = mask
        if any(c <= 0 for c in self.chunks) or not self.chunks:
            raise ValueError(f"schedule chunks must be positive: {self.chunks}")
        # The generated tokens of the first evaluation: later evaluations are fed these.
        self.forced = None
        # A submodule's rotary embedding, built by the first evaluation (see `_Builder`).
        self.rotary = None

    @classmethod
    def single(cls, arg: int = 0, axis: int = 1, length: int = 1):
        """One model-built forward of the whole input, no cache."""
        return cls({"arg": arg, "axis": axis, "chunks": [length], "oneshot": False,
                    "cached": False, "plain": True})


def _parameters(module):
    try:
        return inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return {}


def _inner(module):
    return module.inner if getattr(type(module), "golden_wrapper", False) else module


def _config(module):
    """The configuration a transformers module was built from: its own `config`, or (a decoder
    layer keeps none) its first submodule's."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if hasattr(config, "_attn_implementation"):
            return config
    return getattr(module, "config", None)


def wants_model_inputs(module) -> bool:
    """Whether `module` is a submodule of a Hugging Face model that takes what the model builds:
    its forward has `position_embeddings` (attention and decoder layers)."""
    inner = _inner(module)
    return "position_embeddings" in _parameters(inner) and _config(inner) is not None


def _family_class(module, suffix: str):
    """A class of the module's own modeling file whose name ends with `suffix` (the rotary
    embedding `LlamaRotaryEmbedding` beside `LlamaAttention`)."""
    mod = sys.modules.get(type(module).__module__)
    if mod is None:
        return None
    found = [obj for name, obj in vars(mod).items()
             if isinstance(obj, type) and name.endswith(suffix) and obj.__module__ == mod.__name__]
    return found[0] if found else None


def _default_attention(module, config):
    """A configuration built on its own (not by a model) names no attention implementation, and a
    standalone attention module then runs eager attention without the mask it was never given. Pick
    what the model would: `sdpa` where the family supports it, else `eager`."""
    if config is None or getattr(config, "_attn_implementation", "") is not None:
        return
    base = _family_class(module, "PreTrainedModel")
    config._attn_implementation = "sdpa" if getattr(base, "_supports_sdpa", False) else "eager"


def _is_hf(module) -> bool:
    """A transformers module (its configuration says which attention it uses)."""
    return hasattr(_config(module), "_attn_implementation")


def _layer_type(module, config) -> str:
    """`full_attention` or `sliding_attention` for a layer module, as the model picks its mask."""
    types = getattr(config, "layer_types", None)
    index = next((m.layer_idx for m in module.modules() if isinstance(getattr(m, "layer_idx", None), int)), None)
    if types and index is not None and index < len(types):
        return types[index]
    if getattr(config, "sliding_window", None):
        return "sliding_attention"
    return "full_attention"


class _Builder:
    """The per-step inputs a model builds, for one evaluation of one module."""

    def __init__(self, torch, module, plan: Plan, batch: int, mask):
        self.torch = torch
        self.module = module
        self.plan = plan
        self.batch = batch
        # The prompt's padding mask as a native tensor ([b, n], long), or None.
        self.mask = mask
        inner = _inner(module)
        self.params = _parameters(inner)
        self.config = _config(inner)
        _default_attention(inner, self.config)
        self.top = "input_ids" in self.params or "inputs_embeds" in self.params
        self.rotary = None
        if "position_embeddings" in self.params:
            if plan.rotary is None:
                rotary_class = _family_class(inner, "RotaryEmbedding")
                if rotary_class is None:
                    raise ScheduleError(
                        f"`{type(inner).__name__}.forward` takes `position_embeddings`, and golden found "
                        f"no `*RotaryEmbedding` class in `{type(inner).__module__}` to build them as the "
                        "model does"
                    )
                # Built once, by the first evaluation (in the case dtype, outside the float64
                # promotion): the model builds its rotary embedding at construction, and every
                # evaluation must see the same tables.
                plan.rotary = rotary_class(config=self.config)
            self.rotary = plan.rotary
        self.cache = None
        cache_name = next((n for n in ("past_key_values", "past_key_value") if n in self.params), None)
        self.cache_name = cache_name
        if plan.cached and len(plan.chunks) + plan.generate > 1 and cache_name is None and _is_hf(inner):
            raise ScheduleError(
                f"`{type(inner).__name__}.forward` takes no `past_key_values`: it has no cache that golden "
                "could carry from one step of the schedule to the next"
            )
        if plan.cached and cache_name is not None:
            from transformers.cache_utils import DynamicCache

            # `window-uncached` keeps every position (no sliding layers that drop them).
            keep_all = self.config is None or plan.mistake == "window-uncached"
            self.cache = DynamicCache() if keep_all else DynamicCache(config=self.config)

    def mask_upto(self, end: int):
        """The 2-D padding mask of positions [0, end), or None without padding."""
        if self.mask is None:
            return None
        torch = self.torch
        mask = self.mask
        if end > mask.shape[1]:  # generated tokens are valid
            ones = torch.ones((mask.shape[0], end - mask.shape[1]), dtype=mask.dtype)
            mask = torch.cat([mask, ones], dim=1)
        return mask[:, :end]

    def positions(self, past: int, t: int):
        torch = self.torch
        mask = self.mask_upto(past + t)
        if self.plan.mistake == "positions-restart":
            return torch.arange(0, t).unsqueeze(0).expand(self.batch, t)
        if mask is None or self.plan.mistake in ("positions-unpadded", "padding-ignored"):
            return torch.arange(past, past + t).unsqueeze(0).expand(self.batch, t)
        positions = mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 1)
        return positions[:, past:past + t]

    def kwargs(self, chunk, past: int, t: int, use_cache: bool):
        """The keywords of one call: only those the forward takes."""
        torch = self.torch
        out = {}
        positions = self.positions(past, t)
        unmasked = self.plan.mistake in ("mask-unpadded", "padding-ignored")
        mask2d = None if unmasked else self.mask_upto(past + t)
        if self.plan.mistake == "no-cache":
            use_cache = False
            mask2d = None if mask2d is None else mask2d[:, past:]
        if "position_ids" in self.params:
            out["position_ids"] = positions
        if "cache_position" in self.params:
            out["cache_position"] = torch.arange(past, past + t)
        if self.cache_name is not None:
            out[self.cache_name] = self.cache if use_cache else None
        if "use_cache" in self.params:
            out["use_cache"] = use_cache
        if self.rotary is not None:
            out["position_embeddings"] = self.rotary(chunk, positions)
        if "attention_mask" in self.params:
            if self.top:
                out["attention_mask"] = mask2d
            else:
                out["attention_mask"] = self._layer_mask(chunk, mask2d, positions, use_cache)
        return out

    def _layer_mask(self, chunk, mask2d, positions, use_cache):
        from transformers import masking_utils

        inner = _inner(self.module)
        sliding = _layer_type(inner, self.config) == "sliding_attention"
        make = masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
        return make(
            config=self.config,
            inputs_embeds=chunk,
            attention_mask=mask2d,
            past_key_values=self.cache if use_cache else None,
            position_ids=positions,
        )


def _owned(backend, values):
    """Copies of a call's tensor arguments: a step that writes into its inputs (`x.mul_(2)`, a
    carried state updated in place) changes neither what golden kept of the steps before it nor
    what it gives the steps after it. The port's side does the same (`run/steps.rs`)."""
    return [_copy(backend, v) for v in values]


def _kept(backend, leaves):
    """A step's leaves as golden keeps them: copies, taken as the step returns. A module that
    returns a buffer it writes again at its next call (`self.buf.copy_(...)`) would otherwise
    change the answer of the step before."""
    return [(name, _copy(backend, value)) for name, value in leaves]


def _copy(backend, value):
    if not backend.is_tensor(value):
        return value
    return value.clone() if hasattr(value, "clone") else value.copy()


def _tensor_leaves(out, backend, prefix: str):
    """The tensors of a step's output, named like a forward's (the cache object a model returns,
    `past_key_values`, is state, not an output: `flatten_outputs` leaves it out)."""
    return flatten_outputs(out, backend, prefix=prefix)


def _logits(leaves, step: int):
    for name, value in leaves:
        if name.endswith(".logits"):
            return value
    floats = [(n, v) for n, v in leaves if v.is_floating_point()]
    if len(floats) == 1:
        return floats[0][1]
    raise ScheduleError(
        f"`generate` takes the greedy token from the logits, and step {step}'s outputs "
        f"({', '.join(n for n, _ in leaves)}) have no `logits` leaf"
    )


def _zero_padding(torch, leaves, mask, axis: int, past: int, t: int):
    """Outputs at padded positions become zeros: a port is judged on valid positions only. An
    output holds the step's positions when its first axis is the batch and its sequence axis has the
    step's length (what the reference was given): the one rule by which padded positions are
    excluded on both sides (the runtime's `Plan::positional`; a port's outputs are zeroed at the
    positions the reference's leaf of the same name holds, all of them or the last)."""
    if mask is None:
        return leaves
    valid = mask[:, past:past + t].bool()
    out = []
    for name, value in leaves:
        if value.dim() > axis and value.shape[0] == valid.shape[0] and value.shape[axis] == t:
            shape = [valid.shape[0]] + [1] * (value.dim() - 1)
            shape[axis] = t
            keep = valid.reshape(shape)
            value = torch.where(keep, value, torch.zeros((), dtype=value.dtype))
        out.append((name, value))
    return out


def run(case, plan: Plan, target, pristine, args, phase_error):
    """Drive `target` (this evaluation's module, traced if the check traces) through `plan` on the
    native inputs `args`; `pristine` is an untouched copy for the one-shot run.
    `phase_error(during, error)` turns the reference's exceptions into golden's."""
    backend = case.backend
    torch = backend.torch
    if plan.loop is not None:
        return _run_loop(case, plan, target, args, phase_error)
    x = args[plan.arg]
    if x.dim() <= plan.axis:
        raise ScheduleError(
            f"the scheduled input (argument {plan.arg}) has shape {list(x.shape)}: it has no axis {plan.axis} to split"
        )
    prompt = x.shape[plan.axis]
    steps = list(plan.chunks) + [1] * plan.generate
    total = prompt + plan.generate
    if sum(plan.chunks) != prompt:
        raise ScheduleError(f"the schedule {plan.chunks} does not cover the input's {prompt} positions")
    _check_length(target, total)
    if plan.mistake in ("window-wider", "window-narrower"):
        for module in (target, pristine):
            _move_window(module, 1 if plan.mistake == "window-wider" else -1)
    mask = None if plan.mask is None else backend.to_native(plan.mask).long()
    return _run(case, torch, target, pristine, args, plan, mask, steps, prompt, phase_error)


@contextlib.contextmanager
def _window_uncached(past):
    """The diagnosis' `window-uncached` mistake, while one step runs: transformers' sliding-window
    masks keep their window among the step's own positions, and every cached key (positions before
    `past`) stays visible, as in a port that never trims its cache and masks only within a call."""
    if past is None:
        yield
        return
    from transformers import masking_utils

    original = masking_utils.sliding_window_overlay

    def overlay(sliding_window):
        inner = original(sliding_window)
        return lambda b, h, q, kv: inner(b, h, q, kv) | (kv < past)

    masking_utils.sliding_window_overlay = overlay
    try:
        yield
    finally:
        masking_utils.sliding_window_overlay = original


def _run_loop(case, plan, target, args, phase_error):
    """A step loop: the step function called once per step with the step's index (`step=k`, when
    it takes a `step` keyword), each carried argument the previous step's output leaf. Arguments
    with an axis of steps first (a sampler's random numbers, drawn once for the loop) are given
    whole at every step, each side taking its step's part. Leaves `step.<k>.<leaf>`.

    The diagnosis' mistakes `inputs-reversed` and `inputs-ahead` reorder those arguments' first
    axis: the reference then takes its step's part where a port taking another step's would."""
    carry = [(int(i), leaf) for i, leaf in plan.loop["carry"]]
    count = len(plan.chunks)
    state = list(args)
    order = None
    if plan.mistake == "inputs-reversed":
        order = list(range(count))[::-1]
    elif plan.mistake == "inputs-ahead":
        order = [min(k + 1, count - 1) for k in range(count)]
    if order is not None:
        for i in plan.loop["per_step"]:
            state[i] = state[i][order]
    # Through golden's own wrappers (mutations, variants) to the reference's signature.
    inner = _inner(target)
    inner = getattr(inner, "golden_inner", inner)
    try:
        takes_step = "step" in inspect.signature(inner).parameters
    except (TypeError, ValueError):
        takes_step = False
    leaves = []
    for k in range(count):
        call_args = _owned(case.backend, state)
        kwargs = dict(case.kwargs)
        if takes_step:
            kwargs["step"] = k
        try:
            out = target(*call_args, **kwargs)
        except BaseException as e:  # SystemExit too: a reference must not end the worker
            if isinstance(e, KeyboardInterrupt):
                raise
            raise phase_error(f"step {k} of {count}", e) from None
        step_leaves = _kept(case.backend, flatten_outputs(out, case.backend, prefix="out"))
        for i, leaf in carry:
            value = dict(step_leaves).get(leaf)
            if value is None:
                raise ScheduleError(
                    f"`steps(carry(...))` feeds the step's `{leaf}` back, and step {k} returned "
                    f"{', '.join(n for n, _ in step_leaves)}"
                )
            state[i] = value
        leaves.extend((f"step.{k}.{name}", value) for name, value in step_leaves)
    return leaves


def _move_window(module, delta: int):
    """The diagnosis' window mistake: every sliding window of the module (its configuration's and
    its layers' own copies of it) `delta` keys wider."""
    if module is None:
        return
    config = _config(_inner(module))
    if isinstance(getattr(config, "sliding_window", None), int):
        config.sliding_window += delta
    for sub in module.modules():
        if isinstance(getattr(sub, "sliding_window", None), int) and not isinstance(sub.sliding_window, bool):
            sub.sliding_window += delta


def _check_length(module, total: int):
    config = _config(_inner(module))
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and total > limit:
        raise ScheduleError(
            f"the schedule reaches position {total - 1}, beyond the module's max_position_embeddings "
            f"({limit}): narrow the sequence's dim or raise max_position_embeddings in the config"
        )


def _sample(case, torch, target, pristine, x, plan, mask, phase_error):
    """Sampled generation, once per request (its first evaluation): `generate()` on a copy of the
    module with golden's uniforms in place of `torch.multinomial`; its tokens become the forced
    ones every evaluation feeds, and its raw logits and drawn probabilities, with those of golden's
    probe (a vector of whole-number logits, ties everywhere, `golden_ref.sampling.probe`), the
    leaves `sample.…`."""
    from . import sampling

    backend = case.backend
    spec = plan.sample["spec"]
    uniforms = backend.to_native(plan.sample["uniforms"]).to(torch.float64)
    model = copy.deepcopy(_inner(pristine if pristine is not None else target))
    try:
        tokens, logits, probs = sampling.generate(model, x, mask, spec, uniforms)
    except sampling.SamplingError as e:
        raise ScheduleError(str(e)) from None
    except BaseException as e:  # SystemExit too: a reference must not end the worker
        if isinstance(e, KeyboardInterrupt):
            raise
        raise phase_error("generate() with golden's draws", e) from None
    leaves = []
    for j, (l, p) in enumerate(zip(logits, probs)):
        leaves.append((f"sample.{j}.logits", l.to(torch.float32)))
        leaves.append((f"sample.{j}.probs", p.to(torch.float32)))
    # The probe, after row 0's prompt (its valid tokens) and its generated tokens.
    vocab = logits[0].shape[-1]
    row = x[0] if mask is None else x[0][mask[0].bool()]
    previous = torch.cat([row.reshape(-1).to(torch.int64), tokens[0].to(torch.int64)]).unsqueeze(0)
    probe = sampling.probe(case.seed, vocab, spec, previous)
    u = backend.to_native(plan.sample["probe_uniforms"]).to(torch.float64).reshape(1, -1)
    answer = sampling.process(probe, previous, u, **spec)
    leaves.append(("sample.probe.logits", probe.to(torch.float32)))
    leaves.append(("sample.probe.probs", answer["probs"]))
    leaves.append(("sample.probe.tokens", answer["tokens"]))
    return tokens, leaves


def _run(case, torch, target, pristine, args, plan, mask, steps, prompt, phase_error):
    backend = case.backend
    x = args[plan.arg]
    batch = x.shape[0]
    if plan.sample is not None and plan.generate and plan.forced is None:
        plan.forced, plan.sampled = _sample(case, torch, target, pristine, x, plan, mask, phase_error)
    builder = _Builder(torch, target, plan, batch, mask)
    leaves = []
    generated = []
    sequence = x
    past = 0
    for k, t in enumerate(steps):
        if past < prompt:
            chunk = x.narrow(plan.axis, past, t)
        else:
            token = generated[past - prompt]
            chunk = token.reshape([batch] + [1] * (x.dim() - 1)).to(x.dtype)
        call_args = list(args)
        call_args[plan.arg] = chunk
        call_args = _owned(backend, call_args)
        chunk = call_args[plan.arg]
        kwargs = dict(case.kwargs)
        kwargs.update(builder.kwargs(chunk, past, t, use_cache=plan.cached))
        # `no-cache` for a module that keeps its own state: a fresh one at every call.
        call = target
        if plan.mistake == "no-cache" and builder.cache_name is None and pristine is not None:
            call = copy.deepcopy(pristine)
        try:
            with _window_uncached(past if plan.mistake == "window-uncached" else None):
                out = call(*call_args, **kwargs)
        except BaseException as e:  # SystemExit too: a reference must not end the worker
            if isinstance(e, KeyboardInterrupt):
                raise
            raise phase_error(f"step {k} of the schedule ({_describe(k, past, t, prompt)})", e) from None
        prefix = "out" if plan.plain else f"step.{k}.out"
        step_leaves = _kept(backend, _tensor_leaves(out, backend, prefix))
        step_leaves = _zero_padding(torch, step_leaves, mask if past < prompt else None, plan.axis, past, t)
        if plan.generate and past + t >= prompt and len(generated) < plan.generate:
            generated.append(_next_token(plan, _logits(step_leaves, k), plan.axis, len(generated)))
        leaves.extend(step_leaves)
        past += t
    if plan.generate:
        if plan.forced is None:
            plan.forced = torch.stack(generated, dim=1)
        tokens = plan.forced
        sequence = torch.cat([x, tokens.reshape(list(tokens.shape) + [1] * (x.dim() - 2)).to(x.dtype)], dim=plan.axis)
        leaves.append(("tokens", tokens))
        leaves.extend(plan.sampled or [])
    if plan.cached and plan.oneshot:
        leaves.extend(_oneshot(case, torch, pristine, args, plan, mask, steps, sequence, phase_error))
    return leaves


def _next_token(plan, logits, axis: int, index: int):
    """The greedy token after a step: the argmax at the last position (the forced one when an
    earlier evaluation already chose it)."""
    if plan.forced is not None:
        return plan.forced[:, index]
    last = logits.select(axis, logits.shape[axis] - 1) if logits.dim() > 2 else logits
    return last.argmax(dim=-1)


def _oneshot(case, torch, pristine, args, plan, mask, steps, sequence, phase_error):
    """The whole sequence at once through a fresh copy of the module, sliced at each step's
    positions: `oneshot.<k>.<leaf>`."""
    module = copy.deepcopy(pristine)
    total = sequence.shape[plan.axis]
    builder = _Builder(torch, module, plan, sequence.shape[0], mask)
    builder.cache = None
    call_args = list(args)
    call_args[plan.arg] = sequence
    kwargs = dict(case.kwargs)
    kwargs.update(builder.kwargs(sequence, 0, total, use_cache=False))
    try:
        out = module(*call_args, **kwargs)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise phase_error("the one-shot forward of the whole sequence", e) from None
    whole = _tensor_leaves(out, case.backend, "out")
    whole = _zero_padding(torch, whole, builder.mask_upto(total), plan.axis, 0, total)
    leaves = []
    past = 0
    for k, t in enumerate(steps):
        for name, value in whole:
            if value.dim() > plan.axis and value.shape[plan.axis] == total:
                leaves.append((f"oneshot.{k}.{name}", value.narrow(plan.axis, past, t).contiguous()))
        past += t
    return leaves


def _describe(k: int, past: int, t: int, prompt: int) -> str:
    if k == 0:
        return f"a prefill of {t} token{'s' if t != 1 else ''}"
    if past >= prompt:
        return f"generating the token at position {past}"
    if t == 1:
        return f"a decode step at position {past}"
    return f"a chunk of {t} tokens at positions {past}..{past + t - 1}"
