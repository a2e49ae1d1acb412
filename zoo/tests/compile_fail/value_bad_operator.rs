use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.MLP",
    dims(b = 1..=2, d = 2..=8),
    args(x = [b, d]),
    init(d_model = d, hidden = d % 2),
)]
fn mlp(vb: VarBuilder, x: &Tensor) -> Result<Tensor> {
    let _ = vb;
    Ok(x.clone())
}

fn main() {
    let _ = mlp;
}
