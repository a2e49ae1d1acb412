use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.softmax",
    dims(b = 1..=4, t = 1..=16),
    args(x = [b, t, d]),
)]
fn softmax(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax(x, 2)
}

fn main() {
    let _ = softmax;
}
