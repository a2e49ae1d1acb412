use candle_core::{Result, Tensor};
use golden::golden_layer;

// The loop counts a dim; the carried argument needs a shape; `steps` and `decode` exclude each
// other.
#[golden_layer(
    reference = "zoo_ref.samplers.ddpm_step",
    dims(k = 1..=4, d = 1..=4),
    args(x = [d]),
    steps(over = steps, carry(h = out)),
    decode,
)]
fn step(x: &Tensor, step: usize) -> Result<Tensor> {
    let _ = step;
    Ok(x.clone())
}

fn main() {
    let _ = step;
}
