"""A step loop as golden's `steps(...)` checks one: DDPM's ancestral sampler with a tiny denoiser
(the zoo's `samplers::ddpm_step`; a wrong port in `tests/schedules.rs`).

`ddpm_step` is one step: the timestep runs down as the steps go up, and `noise` holds the random
numbers of every step, drawn once by golden for the whole loop and given to both sides; step k
takes `noise[k]`.
"""

import itertools
import math
import operator

import torch

# A linear beta schedule over at most 8 steps.
STEPS = 8
BETAS = [1e-4 + (0.02 - 1e-4) * i / (STEPS - 1) for i in range(STEPS)]
ALPHAS = [1.0 - b for b in BETAS]
ALPHA_BARS = list(itertools.accumulate(ALPHAS, operator.mul))


def ddpm_step(x, noise, weight, step):
    """x_{t-1} from x_t: the denoiser's noise estimate tanh(x @ weight) removed, then the step's
    random numbers added (none at the last step)."""
    t = noise.shape[0] - 1 - step
    eps = torch.tanh(x @ weight)
    mean = (x - BETAS[t] / math.sqrt(1.0 - ALPHA_BARS[t]) * eps) / math.sqrt(ALPHAS[t])
    if t > 0:
        mean = mean + math.sqrt(BETAS[t]) * noise[step]
    return mean
