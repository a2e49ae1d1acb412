use candle_core::{Module, Result, Tensor};
use candle_nn::{linear, VarBuilder};
use golden::golden_layer;

#[golden_layer(
    reference = "torch.nn.Linear",
    dims(b = 1..=4),
    args(x = [b, 8]),
    init(in_features = 8, out_features = 4),
    overfit(loss = l1, optimizer = adamw),
)]
fn fc(vb: VarBuilder, x: &Tensor, in_features: usize, out_features: usize) -> Result<Tensor> {
    linear(in_features, out_features, vb)?.forward(x)
}

fn main() {
    let _ = fc;
}
