// `params`, `weights` and `rename` are about a module's parameters: function form has none.
use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n]),
    params = init,
    rename("layers." = "encoder.layer."),
)]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

fn main() {
    let _ = gelu;
}
