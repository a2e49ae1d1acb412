//! A sampler's step, checked through a loop of steps (`steps(...)`): golden draws the random
//! numbers of every step once and gives them to both sides, feeds each step's output back as the
//! next step's `x`, and compares every step teacher-forced and free-running.

use candle_core::{Result, Tensor};
use golden::golden_layer;

/// The linear beta schedule of `zoo_ref.samplers` (8 steps at most).
const STEPS: usize = 8;

fn beta(t: usize) -> f64 {
    1e-4 + (0.02 - 1e-4) * t as f64 / (STEPS - 1) as f64
}

/// One step of DDPM's ancestral sampler with a tiny denoiser, `eps = tanh(x @ weight)`: the
/// timestep runs down as the steps go up, and step `step` takes its random numbers at
/// `noise[step]`.
#[golden_layer(
    reference = "zoo_ref.samplers.ddpm_step",
    dims(k = 1..=8, b = 1..=2, d = 1..=8),
    args(x = [b, d], noise = [k, b, d], weight = [d, d] ~ normal(0.0, 0.5)),
    steps(over = k, carry(x = out)),
    cases = 16,
)]
pub fn ddpm_step(x: &Tensor, noise: &Tensor, weight: &Tensor, step: usize) -> Result<Tensor> {
    let t = noise.dim(0)? - 1 - step;
    let alpha_bar: f64 = (0..=t).map(|s| 1.0 - beta(s)).product();
    let eps = x.matmul(weight)?.tanh()?;
    let mean = ((x - (eps * (beta(t) / (1.0 - alpha_bar).sqrt()))?)? / (1.0 - beta(t)).sqrt())?;
    if t == 0 {
        return Ok(mean);
    }
    mean + (noise.get(step)? * beta(t).sqrt())?
}
