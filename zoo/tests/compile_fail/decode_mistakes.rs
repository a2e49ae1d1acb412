use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use golden::golden_layer;

// `decode` needs the module form.
#[golden_layer(
    reference = "transformers.LlamaForCausalLM",
    dims(n = 2..=8),
    args(ids = [1, n] ~ int(0..8)),
    decode,
)]
fn function_form(ids: &Tensor) -> Result<Tensor> {
    Ok(ids.clone())
}

// The sequence must have a shape; the step's tensors are not the function's parameters.
#[golden_layer(
    reference = "transformers.LlamaForCausalLM",
    dims(n = 2..=8),
    args(ids = [1, n] ~ int(0..8)),
    decode(over = tokens, padding),
)]
fn wrong_over(vb: VarBuilder, ids: &Tensor) -> Result<Tensor> {
    let _ = vb;
    Ok(ids.clone())
}

fn main() {
    let _ = function_form;
    let _ = wrong_over;
}
