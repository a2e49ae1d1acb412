"""A reference whose float32 result rounding decides, for tests/verdicts.rs: what a saturated
softmax does to attention's gradient at inputs ×100, in a few lines.

Two scores equal in exact arithmetic are summed in two orders; sharpened 1e5 times (attention's
scores at inputs ×100 are thousands of times the inputs), a one-ulp difference between the two
float32 sums moves the probabilities by thousandths, and which way is decided by rounding: a
one-ulp nudge of an input resolves it otherwise. In float64 the two scores tie exactly."""

import torch


def sharp_softmax(x):
    """softmax(1e5 · [(x0 + x1) + x2, x0 + (x1 + x2), x3]) over the last axis."""
    a = (x[..., 0] + x[..., 1]) + x[..., 2]
    b = x[..., 0] + (x[..., 1] + x[..., 2])
    return torch.softmax(torch.stack([a, b, x[..., 3]], -1) * 1e5, -1)
