use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.layer_norm",
    dims(d = 1..=8),
    args(x = [d], weight = [d], bias = [d]),
    consts(eps = 1e-5),
    grad(wrt = [x, gamma, "ln.weight"]),
)]
fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let _ = eps;
    x.broadcast_mul(weight)?.broadcast_add(bias)
}

fn main() {
    let _ = layer_norm;
}
