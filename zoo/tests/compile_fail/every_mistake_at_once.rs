use candle_core::{Result, Tensor};
use golden::golden_layer;

// Mistakes in several options, and in how the options fit the signature: each is reported, at
// its place, in one build. A malformed option does not stop the others from being read. `offset`
// is not called a parameter without a value: `dims(...)` did not parse, and might have named it.
#[golden_layer(
    reference = "zoo_ref.scale",
    dims(n = 1..=8, m = x, k = 4..=1),
    args(x = [n] ~ gauss(0.0, 1.0)),
    tolerance = 1e-3,
    consts(factor = 2.0),
    cases = 0,
    backend = "jax",
    trace,
    grad(wrt = [factor]),
)]
fn scale(x: &Tensor, factor: f64, offset: f64) -> Result<Tensor> {
    (x * factor)? + offset
}

fn main() {
    let _ = scale;
}
