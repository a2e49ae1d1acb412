use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n] ~ gaussian(0.0, 1.0)),
)]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n] ~ normal(0.0)),
)]
fn gelu2(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n], position_ids = [n] ~ positions(1.5)),
)]
fn gelu3(x: &Tensor, position_ids: &Tensor) -> Result<Tensor> {
    let _ = position_ids;
    x.gelu_erf()
}

#[golden_layer(
    reference = "zoo_ref.gelu",
    dims(n = 1..=8),
    args(x = [n], position_ids = [n] ~ positions),
)]
fn gelu4(x: &Tensor, position_ids: &Tensor) -> Result<Tensor> {
    let _ = position_ids;
    x.gelu_erf()
}

fn main() {
    let _ = (gelu, gelu2, gelu3, gelu4);
}
