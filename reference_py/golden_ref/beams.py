"""Beam search as transformers does it, recorded step by step.

`generate(num_beams=k, do_sample=False)` keeps, per row, k running beams: at each generated token
it adds every running beam's cumulative score to the log-probabilities of its next token (the
log-softmax of the model's logits), takes the best 2k of the k·vocab candidates (so that k remain
when some end), keeps the best k that did not end as the running beams, and moves the ones that
ended into the finished hypotheses with their score divided by `length ** length_penalty`. At the
last token every candidate ends (the maximum length): the k finished hypotheses are the answer.

golden records, for every generated token j (`beams.<j>.…`, each row's k beams):

* `sequences` [b, k, prompt + j]: the running beams the step extends (their tokens so far);
* `scores` [b, k]: their cumulative log-probabilities (before the first token, 0 for beam 0 and
  -1e9 for the others, as transformers starts: the k copies of the prompt are one beam);
* `logprobs` [b, k, vocab]: the log-probabilities of every candidate token of each beam;
* `from`, `tokens`, `next` [b, k]: the beams kept after the step, best first — the beam each
  extends, its new token, its score (cumulative; at the last token, the finished hypotheses'
  scores, length-penalised, as `sequences_scores`).

The records are read from transformers' own beam search while it runs (its running beams after
each step and its log-probabilities), never recomputed; no end-of-sequence token (a model's
configuration names one, which would end beams a port given only the parameters knows nothing of).
"""

from __future__ import annotations


class BeamError(Exception):
    """The beam-search parameters or inputs cannot be used (a check error, before any step)."""


def generate(model, input_ids, mask, spec: dict, count: int):
    """`model.generate()` with beam search of `spec` (`beams`, `length_penalty`, `early_stopping`)
    for `count` tokens. Returns the best beam's tokens [b, count] and the leaves `beams.<j>.…`."""
    import torch
    from transformers import GenerationConfig

    k = int(spec["beams"])
    if k < 1:
        raise BeamError(f"beam search keeps at least one beam (beams = {k})")
    if mask is not None:
        raise BeamError("golden's beam search is checked on unpadded batches")
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        if config is not None and hasattr(config, "eos_token_id"):
            config.eos_token_id = None
    config = GenerationConfig(
        do_sample=False,
        num_beams=k,
        num_return_sequences=k,
        max_new_tokens=count,
        min_new_tokens=count,
        length_penalty=float(spec.get("length_penalty", 1.0)),
        early_stopping=bool(spec.get("early_stopping", False)),
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    batch, prompt = input_ids.shape[0], input_ids.shape[1]
    running = []  # per step: (sequences [b, k, max], scores [b, k], beam indices [b, k, count])
    original = model._get_running_beams_for_next_iteration

    def recorded(*args, **kwargs):
        out = original(*args, **kwargs)
        running.append(tuple(t.detach().clone() for t in out))
        return out

    model._get_running_beams_for_next_iteration = recorded
    try:
        with torch.no_grad():
            out = model.generate(input_ids, generation_config=config)
    finally:
        del model._get_running_beams_for_next_iteration
    if len(out.scores) != count or len(running) != count:
        raise BeamError(f"generate() ran {len(out.scores)} beam steps where {count} were asked")
    leaves = []
    sequences = input_ids.to(torch.int64).unsqueeze(1).expand(batch, k, prompt)
    scores = torch.full((batch, k), -1e9, dtype=torch.float32)
    scores[:, 0] = 0.0
    offset = torch.arange(batch).view(-1, 1) * k
    for j in range(count):
        leaves.append((f"beams.{j}.sequences", sequences.clone()))
        leaves.append((f"beams.{j}.scores", scores.clone()))
        logprobs = out.scores[j].to(torch.float32).reshape(batch, k, -1)
        leaves.append((f"beams.{j}.logprobs", logprobs))
        if j + 1 < count:
            seqs, kept, indices = running[j]
            sequences = seqs[:, :, : prompt + j + 1].to(torch.int64)
            scores = kept.to(torch.float32)
            source = indices[:, :, j].to(torch.int64) - offset
            leaves.append((f"beams.{j}.from", source))
            leaves.append((f"beams.{j}.tokens", sequences[:, :, -1].clone()))
            leaves.append((f"beams.{j}.next", scores.clone()))
        else:
            # The last token: every candidate ends; the k finished hypotheses, best first.
            final = out.sequences.reshape(batch, k, -1)
            source = out.beam_indices.reshape(batch, k, -1)[:, :, j].to(torch.int64) - offset
            leaves.append((f"beams.{j}.from", source))
            leaves.append((f"beams.{j}.tokens", final[:, :, prompt + j].to(torch.int64)))
            leaves.append((f"beams.{j}.next", out.sequences_scores.reshape(batch, k).to(torch.float32)))
    best = out.sequences.reshape(batch, k, -1)[:, 0, prompt:]
    return best.to(torch.int64), leaves
