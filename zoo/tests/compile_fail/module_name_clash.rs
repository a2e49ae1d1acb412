use candle_core::{Result, Tensor};
use golden::golden_layer;

/// Helpers of the port, in a module named like its function (#21 item 14: this gave the compiler's
/// E0428 under `cargo test`, which names neither golden nor the fix).
pub mod gelu {
    pub fn scale() -> f64 {
        1.0
    }
}

#[golden_layer(reference = "zoo_ref.gelu", dims(n = 1..=8), args(x = [n]))]
fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()? * gelu::scale()
}

fn main() {
    // The item is still emitted: using it adds no error.
    let _ = gelu;
}
