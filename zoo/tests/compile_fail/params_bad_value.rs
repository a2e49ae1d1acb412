// `params` takes `init` or `drawn`; `weights` and `params` cannot both say where parameters come from.
use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use golden::golden_layer;

#[golden_layer(
    reference = "torch.nn.Linear",
    dims(b = 1..=4),
    args(x = [b, 8]),
    init(in_features = 8, out_features = 4),
    params = random,
)]
fn linear(vb: VarBuilder, x: &Tensor) -> Result<Tensor> {
    candle_nn::linear(8, 4, vb)?.forward(x)
}

#[golden_layer(
    reference = "torch.nn.Linear",
    dims(b = 1..=4),
    args(x = [b, 8]),
    init(in_features = 8, out_features = 4),
    weights = "linear.safetensors",
    params = init,
)]
fn linear_twice(vb: VarBuilder, x: &Tensor) -> Result<Tensor> {
    candle_nn::linear(8, 4, vb)?.forward(x)
}

fn main() {
    let _ = (linear, linear_twice);
}
