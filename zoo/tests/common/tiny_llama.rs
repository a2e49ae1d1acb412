//! The tiny `LlamaForCausalLM` that `tests/sampling.rs` and `tests/beams.rs` generate with: the
//! layer of its checks (transformers' class from a small config, a prompt of 2 to 5 tokens in a
//! batch of 1 or 2) and candle-transformers' config of the same model, for the port.

use candle_transformers::models::llama;
use golden::{DimExpr, Dist, Layer};

pub const VOCAB: usize = 32;
pub const HIDDEN: usize = 16;
pub const INTERMEDIATE: usize = 24;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const POSITIONS: usize = 64;

/// The check's layer before its `decode(...)`: the reference and its config, the dims and the
/// prompt.
pub fn layer(name: &str) -> Layer {
    Layer::module(name, "transformers.LlamaForCausalLM")
        .config("transformers.LlamaConfig")
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", HIDDEN)
        .config_value("intermediate_size", INTERMEDIATE)
        .config_value("num_hidden_layers", LAYERS)
        .config_value("num_attention_heads", HEADS)
        .config_value("num_key_value_heads", KV_HEADS)
        .config_value("max_position_embeddings", POSITIONS)
        .config_value("rms_norm_eps", 1e-6)
        .config_value("tie_word_embeddings", false)
        .dim("b", 1, 2)
        .dim("n", 2, 5)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("n")],
            Dist::int(0, VOCAB as i64),
        )
}

/// candle-transformers' config of the same model.
pub fn config() -> llama::Config {
    llama::Config {
        hidden_size: HIDDEN,
        intermediate_size: INTERMEDIATE,
        vocab_size: VOCAB,
        num_hidden_layers: LAYERS,
        num_attention_heads: HEADS,
        num_key_value_heads: KV_HEADS,
        use_flash_attn: false,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: POSITIONS,
        tie_word_embeddings: false,
    }
}
