"""Sampling as transformers does it, made reproducible: the logits processors of `generate()`,
and the draw, taken from uniform numbers golden gives.

`generate(do_sample=True)` builds its logits processors in a fixed order
(`GenerationMixin._get_logits_processor`: the repetition penalty among the first, then the warpers
temperature, top-k, top-p, min-p) and samples with `torch.multinomial(probs, 1)`, whose random
numbers no other library reproduces. golden replaces that one call while `generate()` runs: the
draw of row b at generated token j takes golden's uniform `u[b, j]` (drawn by the runtime from the
case seed) and picks by the inverse of the cumulative distribution, in vocabulary order:

    the first token i (vocabulary order) whose cumulative probability sum(p[0..=i]) exceeds u * sum(p),

the sums in float64 over the float32 probabilities `generate()` computed. A port that takes `u` and
does the same inverse-CDF draws the same tokens; one that draws its own random numbers is judged
by the distribution of its draws (the runtime's `judge/distribution.rs`).

`process` is the same processors and the same draw on given logits vectors, a function-form
reference of its own: the runtime asks it for the probabilities and tokens of vectors that are not
a model's (vectors with ties, the smaller vectors of shrinking), and for the same with one porting
mistake made in the processors (`MISTAKES`, the diagnosis of a failing sampler).

`_get_logits_processor` is transformers' own: the order of the processors is read from
transformers, not copied. Every sampling parameter is given explicitly (`top_k=0` when none is
declared), because `generate()` otherwise fills in defaults (`top_k=50`) that a port knows nothing
about.
"""

from __future__ import annotations

import contextlib
import types

# Porting mistakes in a sampler, made in the reference's processors or draw for the diagnosis of a
# failing sampler (the runtime's `describe/sampling.rs` names them and their fixes).
MISTAKES = (
    "temperature-last",
    "top-p-drops-crossing",
    "top-p-keeps-one-more",
    "top-p-unrenormalised",
    "top-k-ties-by-index",
    "sorted-draw",
    "unnormalised",
    "greedy",
    "penalty-divides-all",
    "skip-repetition-penalty",
    "skip-temperature",
    "skip-top-k",
    "skip-top-p",
    "skip-min-p",
)


class SamplingError(Exception):
    """The sampling parameters or inputs cannot be used (a check error, before any draw)."""


def generation_kwargs(spec: dict) -> dict:
    """The keywords of a `GenerationConfig` for `spec` (`temperature`, `top_k`, `top_p`, `min_p`,
    `repetition_penalty`, each optional): every one given, the neutral value where not declared."""
    temperature = spec.get("temperature")
    top_k = spec.get("top_k")
    top_p = spec.get("top_p")
    min_p = spec.get("min_p")
    penalty = spec.get("repetition_penalty")
    return {
        "do_sample": True,
        "temperature": 1.0 if temperature is None else float(temperature),
        "top_k": 0 if top_k is None else int(top_k),
        "top_p": 1.0 if top_p is None else float(top_p),
        "min_p": None if min_p is None else float(min_p),
        "repetition_penalty": 1.0 if penalty is None else float(penalty),
    }


class _Host:
    """What `_get_logits_processor` reads of the model it is a method of: a decoder-only
    configuration (no guidance, no watermark)."""

    def __init__(self):
        self.config = types.SimpleNamespace(is_encoder_decoder=False)

    def _merge_criteria_processor_list(self, default_list, custom_list):
        from transformers.generation.utils import GenerationMixin

        return GenerationMixin._merge_criteria_processor_list(self, default_list, custom_list)


def transformers_processors(spec: dict, prompt: int = 1):
    """transformers' processors for `spec`, in transformers' order (a `LogitsProcessorList`)."""
    from transformers import GenerationConfig
    from transformers.generation.utils import GenerationMixin

    config = GenerationConfig(**generation_kwargs(spec))
    return GenerationMixin._get_logits_processor(_Host(), config, input_ids_seq_length=prompt,
                                                 device="cpu", model_kwargs={})


def _kind(processor) -> str:
    name = type(processor).__name__
    return {
        "RepetitionPenaltyLogitsProcessor": "repetition-penalty",
        "TemperatureLogitsWarper": "temperature",
        "TopKLogitsWarper": "top-k",
        "TopPLogitsWarper": "top-p",
        "MinPLogitsWarper": "min-p",
    }.get(name, name)


def applies(mistake: str, spec: dict) -> bool:
    """Whether `mistake` can change anything under `spec` (a processor that is there)."""
    kinds = [_kind(p) for p in transformers_processors(spec)]
    truncating = [k for k in kinds if k in ("top-k", "top-p", "min-p")]
    if mistake.startswith("skip-"):
        return mistake[len("skip-"):] in kinds
    return {
        "temperature-last": "temperature" in kinds and bool(truncating) and kinds[-1] != "temperature",
        "top-p-drops-crossing": "top-p" in kinds,
        "top-p-keeps-one-more": "top-p" in kinds,
        "top-p-unrenormalised": "top-p" in kinds and "top-k" in kinds,
        "top-k-ties-by-index": "top-k" in kinds,
        "unnormalised": bool(truncating),
        "penalty-divides-all": "repetition-penalty" in kinds,
    }.get(mistake, True)


class _TopPCrossing:
    """Top-p whose cut is one token off: `drop` keeps only the tokens whose cumulative mass,
    themselves included, is at most p (the token that crosses p is dropped); otherwise the token
    after the crossing one is kept too."""

    def __init__(self, top_p: float, drop: bool):
        self.top_p = top_p
        self.drop = drop

    def __call__(self, input_ids, scores):
        import torch

        ordered, index = torch.sort(scores, descending=True, stable=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the mass of the tokens before each
        if self.drop:
            remove = (before + probs) > self.top_p
        else:
            remove = torch.zeros_like(before, dtype=torch.bool)
            remove[..., 2:] = before[..., 1:-1] >= self.top_p
        remove[..., 0] = False
        return scores.masked_fill(remove.scatter(-1, index, remove), float("-inf"))


class _TopKByIndex:
    """Top-k that keeps exactly k tokens, ties at the k-th broken by the lower index, where
    transformers keeps every token tied with the k-th."""

    def __init__(self, top_k: int):
        self.top_k = top_k

    def __call__(self, input_ids, scores):
        import torch

        k = min(self.top_k, scores.shape[-1])
        _, index = torch.sort(scores, descending=True, stable=True)
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(-1, index[..., :k], True)
        return scores.masked_fill(~keep, float("-inf"))


class _TopKThenTopPUnrenormalised:
    """Top-k, then top-p whose cumulative mass is taken from the probabilities of the whole
    vocabulary (those before top-k), not renormalised over the k tokens kept."""

    def __init__(self, top_k, top_p):
        self.top_k = top_k
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        import torch

        full = scores.softmax(dim=-1)
        kept = self.top_k(input_ids, scores)
        ordered, index = torch.sort(kept, descending=True, stable=True)
        probs = full.gather(-1, index)
        before = probs.cumsum(dim=-1) - probs
        remove = (before >= self.top_p.top_p) | torch.isinf(ordered)
        remove[..., 0] = False
        return scores.masked_fill(remove.scatter(-1, index, remove), float("-inf"))


class _PenaltyDividesAll:
    """The repetition penalty dividing every repeated token's logit, negative ones too (which makes
    them more likely)."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, input_ids, scores):
        seen = scores.gather(1, input_ids)
        return scores.scatter(1, input_ids, seen / self.penalty)


def processors(spec: dict, mistake: str | None = None, prompt: int = 1):
    """The processors of `spec` as a list of callables `(input_ids, scores) -> scores`:
    transformers' own in transformers' order, with `mistake` made in them (None: as they are)."""
    found = list(transformers_processors(spec, prompt))
    if mistake is None:
        return found
    kinds = [_kind(p) for p in found]
    if mistake.startswith("skip-"):
        return [p for p, k in zip(found, kinds) if k != mistake[len("skip-"):]]
    if mistake == "temperature-last":
        temperature = [p for p, k in zip(found, kinds) if k == "temperature"]
        return [p for p, k in zip(found, kinds) if k != "temperature"] + temperature
    out = []
    for p, k in zip(found, kinds):
        if k == "top-p" and mistake in ("top-p-drops-crossing", "top-p-keeps-one-more"):
            out.append(_TopPCrossing(p.top_p, drop=mistake == "top-p-drops-crossing"))
        elif k == "top-k" and mistake == "top-k-ties-by-index":
            out.append(_TopKByIndex(p.top_k))
        elif k == "repetition-penalty" and mistake == "penalty-divides-all":
            out.append(_PenaltyDividesAll(p.penalty))
        elif k == "top-p" and mistake == "top-p-unrenormalised":
            top_k = out.pop(next(i for i in range(len(out) - 1, -1, -1) if _kind(out[i]) == "top-k"))
            out.append(_TopKThenTopPUnrenormalised(top_k, p))
        else:
            out.append(p)
    return out


@contextlib.contextmanager
def stable_sort():
    """While the processors run: `torch.sort` keeps equal values in index order. transformers'
    top-p sorts with `torch.sort`, which states no order for equal values, so which of several
    tied tokens at its cut it keeps is otherwise an accident of the sort; golden fixes it (the
    lower index is removed first, as the ascending order has it), so that its own answers repeat.
    No port is held to it: golden's probe never puts top-p's cut inside a tie, and shrinking never
    keeps a vector that does (`process`'s `ambiguous`)."""
    import torch

    original = torch.sort

    def sort(input, dim=-1, descending=False, stable=None, *, out=None):
        if out is not None:
            return original(input, dim=dim, descending=descending, stable=True, out=out)
        return original(input, dim=dim, descending=descending, stable=True)

    torch.sort = sort
    try:
        yield
    finally:
        torch.sort = original


def _apply(chain, input_ids, scores):
    with stable_sort():
        for p in chain:
            scores = p(input_ids, scores)
    return scores


def _ambiguous(spec, ids, logits) -> bool:
    """Whether top-p's cut falls inside a group of equal scores (see `stable_sort`)."""
    import torch

    chain = processors(spec)
    at = next((i for i, p in enumerate(chain) if _kind(p) == "top-p"), None)
    if at is None:
        return False
    before = _apply(chain[:at], ids, logits.clone())
    after = _apply(chain[at:at + 1], ids, before.clone())
    kept = torch.isfinite(after)
    removed = ~kept & torch.isfinite(before)
    return bool((removed & (before == before[kept].min())).any())


def inverse_cdf(probs, u):
    """golden's draw: for each row of `probs` ([m, vocab]) and each of its uniforms `u` ([m, d],
    float64 in [0, 1)), the first token in vocabulary order whose cumulative probability exceeds
    `u * sum(p)`, the sums in float64; never a token of probability 0. Returns [m, d] int64."""
    import torch

    p = probs.to(torch.float64)
    cdf = p.cumsum(dim=-1)
    target = u.to(torch.float64) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target.contiguous(), right=True)
    # Rounding can leave a target at or past the total: the last token that can be drawn.
    last = (p > 0).to(torch.int64).cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    return torch.minimum(tokens, last.expand_as(tokens))


def _row_ids(previous, row):
    """A row's tokens so far, `[1, n]`: its entries of `previous` that are not negative (-1 pads
    the rows of different lengths)."""
    ids = previous[row]
    return ids[ids >= 0].unsqueeze(0).to(dtype=__import__("torch").int64)


def _distribution(spec, mistake, ids, logits):
    """The probabilities a sampler with `mistake` draws from, for one row (`logits` [1, vocab]),
    and the scores whose softmax they are (None where the draw itself is the mistake)."""
    import torch

    chain = processors(spec, None if mistake in ("sorted-draw", "unnormalised", "greedy") else mistake)
    scores = _apply(chain, ids, logits.clone())
    probs = scores.softmax(dim=-1)
    if mistake == "greedy":
        probs = torch.zeros_like(probs)
        probs.scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    elif mistake == "unnormalised":
        # Truncated but not renormalised: the probabilities before the truncating processors, zero
        # where they removed a token; a draw past their total falls to the last token kept.
        untruncated = [p for p in chain if _kind(p) not in ("top-k", "top-p", "min-p")]
        full = _apply(untruncated, ids, logits.clone()).softmax(dim=-1)
        kept = torch.isfinite(scores)
        unnormalised = torch.where(kept, full, torch.zeros_like(full))
        last = int(kept.to(torch.int64).cumsum(dim=-1).argmax(dim=-1))
        probs = unnormalised.clone()
        probs[0, last] += (1.0 - unnormalised.to(torch.float64).sum()).clamp(min=0).to(probs.dtype)
    return probs


def _draw(mistake, probs, u):
    import torch

    if mistake == "sorted-draw":
        ordered, index = torch.sort(probs, descending=True, stable=True)
        return index.gather(-1, inverse_cdf(ordered, u))
    return inverse_cdf(probs, u)


def process(logits, previous, u, *, temperature=None, top_k=None, top_p=None, min_p=None,
            repetition_penalty=None, mistake=None):
    """Sampling on given logits: `logits` [m, vocab], each row's tokens so far `previous` [m, n]
    (the repetition penalty's; -1 where a row has fewer), golden's uniforms `u` [m, d]. Returns
    `probs` [m, vocab] (what the draw is from, float32 as `generate()` has them) and `tokens`
    [m, d] (golden's inverse-CDF draw for each uniform), with `mistake` (see `MISTAKES`) made in
    the processors or the draw."""
    import torch

    if mistake is not None and mistake not in MISTAKES:
        raise SamplingError(f"unknown sampling mistake {mistake!r}")
    spec = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
            "repetition_penalty": repetition_penalty}
    logits = logits.to(torch.float32)
    rows = []
    for row in range(logits.shape[0]):
        rows.append(_distribution(spec, mistake, _row_ids(previous, row), logits[row:row + 1]))
    probs = torch.cat(rows, dim=0) if rows else logits.clone()
    # `unnormalised`'s probabilities hold the missing mass at the last token kept, where its draw
    # falls past their total: the usual draw on them is the mistaken one.
    tokens = [_draw(mistake, probs[r:r + 1], u[r:r + 1]) for r in range(probs.shape[0])]
    tokens = torch.cat(tokens) if tokens else torch.zeros((0, u.shape[-1]), dtype=torch.int64)
    ambiguous = torch.tensor([int(_ambiguous(spec, _row_ids(previous, r), logits[r:r + 1]))
                              for r in range(logits.shape[0])], dtype=torch.int64)
    return {"probs": probs.to(torch.float32), "tokens": tokens, "ambiguous": ambiguous}


def probe(seed: int, vocab: int, spec: dict, previous):
    """golden's probe of a case: `vocab` logits that are whole numbers, `round(1.5 z)` for standard
    normal z drawn from the case seed, so that ties are everywhere (at top-k's k-th token, at the
    top, in the draw), where a model's logits have none. Returns [1, vocab] float32.

    One tie is left out: top-p's cut inside a group of equal scores. transformers sorts the scores
    with `torch.sort`, which does not keep equal values in any stated order, so which of the tied
    tokens it keeps there is an accident of the sort — no port can be held to it. The first draw
    (of up to 64 from the seed) whose cut falls between two different scores is the probe."""
    import numpy as np
    import torch

    for attempt in range(64):
        rng = np.random.default_rng([seed & 0xFFFF_FFFF_FFFF_FFFF, 0x5A3, attempt])
        logits = torch.from_numpy(np.round(1.5 * rng.standard_normal(vocab)).astype(np.float32)).reshape(1, vocab)
        if not _ambiguous(spec, previous, logits):
            return logits
    return logits


@contextlib.contextmanager
def drawing_with(uniforms):
    """While `generate()` runs: `torch.multinomial(probs, 1)` draws golden's inverse-CDF token with
    `uniforms[:, j]` at its j-th call. Yields the list of the probabilities it drew from."""
    import torch

    drawn = []
    original = torch.multinomial

    def multinomial(probs, num_samples, replacement=False, *, generator=None, out=None):
        j = len(drawn)
        if num_samples != 1 or probs.dim() != 2 or j >= uniforms.shape[1]:
            raise SamplingError(
                f"golden's draw replaces `torch.multinomial(probs, 1)` for the {uniforms.shape[1]} "
                f"generated tokens, and was called with {num_samples} samples of a "
                f"{list(probs.shape)} tensor at call {j}"
            )
        drawn.append(probs.detach().clone())
        return inverse_cdf(probs, uniforms[:, j:j + 1])

    torch.multinomial = multinomial
    try:
        yield drawn
    finally:
        torch.multinomial = original


def _check_processors(found, spec):
    names = [type(p).__name__ for p in found]
    expected = [type(p).__name__ for p in transformers_processors(spec)]
    if names != expected:
        raise SamplingError(
            f"generate() built the processors {names}, where the sampling parameters give {expected}: "
            "a model's generation configuration adds processors a port of the sampler would not know of"
        )


def generate(model, input_ids, mask, spec: dict, uniforms):
    """`model.generate()` sampling `uniforms.shape[1]` tokens with `spec`, golden's draws in place of
    `torch.multinomial`. Returns the tokens [b, N] and, per generated token, the raw logits and the
    probabilities drawn from ([b, vocab] each)."""
    from transformers import GenerationConfig

    count = int(uniforms.shape[1])
    # No end of sequence: N tokens, every one drawn from the processors of `spec` alone (a model's
    # configuration names an eos token, Llama's 2, and `generate()` would otherwise forbid it until
    # a minimum length, with processors a port of the sampler knows nothing about, or stop at it).
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        if config is not None and hasattr(config, "eos_token_id"):
            config.eos_token_id = None
    config = GenerationConfig(
        **generation_kwargs(spec),
        max_new_tokens=count,
        num_beams=1,
        pad_token_id=0,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    kwargs = {"attention_mask": mask} if mask is not None else {}
    # The processors `generate()` builds are checked to be those of `spec` alone.
    build = model._get_logits_processor

    def checked(*args, **kw):
        found = build(*args, **kw)
        _check_processors(found, spec)
        return found

    model._get_logits_processor = checked
    with drawing_with(uniforms) as drawn, stable_sort():
        out = model.generate(input_ids, generation_config=config, **kwargs)
    tokens = out.sequences[:, input_ids.shape[1]:]
    if tokens.shape[1] != count or len(drawn) != count:
        raise SamplingError(
            f"generate() sampled {tokens.shape[1]} tokens with {len(drawn)} draws where {count} were asked"
        )
    return tokens, [t.detach().clone() for t in out.logits], drawn
