use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n]),
    trace,
)]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

fn main() {
    let _ = gelu;
}
