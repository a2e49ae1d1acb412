use candle_core::{Result, Tensor};
use golden::golden_layer;

// The port is named `golden` (#31, minor): its tests' module `golden` would make `use golden::...`
// above ambiguous under `cargo test`, which rustc says without naming golden's module or the fix.
#[golden_layer(reference = "zoo_ref.gelu", dims(n = 1..=8), args(x = [n]))]
fn golden(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

fn main() {
    // The item is still emitted: using it adds no error.
    let _ = golden;
}
