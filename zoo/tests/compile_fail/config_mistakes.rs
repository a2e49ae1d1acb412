use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use golden::golden_layer;

#[golden_layer(
    reference = "transformers.models.llama.modeling_llama.LlamaMLP",
    dims(b = 1..=2, d = 2..=8),
    args(x = [b, 2 * q]),
    config = "LlamaConfig"(hidden_size = d, intermediate_size = 4 * hidden, rope_parameters = {"rope_type": "default"}),
    init(layer_idx = 0),
)]
fn mlp(vb: VarBuilder, x: &Tensor, rope_parameters: usize) -> Result<Tensor> {
    let _ = (vb, rope_parameters);
    Ok(x.clone())
}

fn main() {
    let _ = mlp;
}
