"""Logits as language models cap them: the zoo's example of a configuration sweep."""

import torch


def capped_logits(x, weight, softcap=None):
    """Logits `x @ weight.T`, soft-capped to (-softcap, softcap) when `softcap` is given, as Gemma 2
    caps its final logits (`final_logit_softcapping`)."""
    logits = x @ weight.T
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits
