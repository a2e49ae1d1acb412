use candle_core::{Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    reference = "zoo_ref.scaled",
    dims(n = 1..=4, h = 1..=2),
    args(x = [n]),
    consts(
        a = one_of(),
        b = [one_of(1, 2)],
        c = 5..=1,
        n = one_of(1, 2),
        e = one_of(1, 2, 3),
        f = n / 0,
        g = one_of(n / h, 2 * n / k),
    ),
    cases = 2,
)]
fn scaled(x: &Tensor, e: i64) -> Result<Tensor> {
    let _ = e;
    Ok(x.clone())
}

fn main() {
    let _ = scaled;
}
