use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    dims(n = 1..=8),
    args(x = [n]),
    dtypes = [f32, f8],
)]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

fn main() {
    let _ = gelu;
}
