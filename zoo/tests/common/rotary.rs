//! transformers' `LlamaRotaryEmbedding` as a check: head size 16, 4096 positions, its `(cos, sin)`
//! for `position_ids` drawn long and sparse (`~ positions`). Used by `tests/half_precision.rs` and
//! `tests/reach_unseen.rs`, each with its own ports.

use candle_core::DType;
use golden::{DimExpr, Dist, Layer};

/// The check of `LlamaRotaryEmbedding` in `dtype`, 16 cases.
pub fn llama_rotary(name: &str, dtype: DType) -> Layer {
    Layer::module(
        name,
        "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", 64usize)
    .config_value("num_attention_heads", 4usize)
    .config_value("max_position_embeddings", 4096usize)
    .dim("b", 1, 2)
    .dim("t", 1, 8)
    .arg(
        "x",
        [DimExpr::from("b"), "t".into(), DimExpr::Lit(16)],
        Dist::default(),
    )
    .arg(
        "position_ids",
        [DimExpr::from("b"), "t".into()],
        Dist::Positions { max: None },
    )
    .dtypes(&[dtype])
    .cases(16)
}
