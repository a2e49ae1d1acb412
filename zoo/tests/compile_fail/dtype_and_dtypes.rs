use candle_core::{Result, Tensor};
use golden::golden_layer;

// `dtype` and `dtypes` both say which dtypes to check: before, this compiled and `dtypes` won.
#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n]),
    dtype = f32,
    dtypes = [f32, bf16],
)]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

fn main() {
    let _ = gelu;
}
