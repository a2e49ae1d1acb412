use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.linear",
    dims(n = 1..=8, m = 1..=8),
    args(x = [n, m], weight = [m, m]),
)]
fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.matmul(&weight.t()?)?.broadcast_add(bias)
}

fn main() {
    let _ = linear;
}
