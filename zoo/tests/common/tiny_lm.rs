//! The traced model of `tests/trace.rs` (and of the HTML report's test): the zoo's TinyLM, smaller,
//! checked against `zoo_ref.TinyLM`. Their golden stores are shared, so the descriptions must be.

use golden::{DimExpr, Dist, Layer};
use golden_zoo::model::Config;

/// Smaller than the zoo's model (its store holds a state_dict per case), with a block after the
/// planted bug.
pub const CONFIG: Config = Config {
    vocab: 32,
    d_model: 16,
    n_heads: 2,
    hidden: 32,
    n_layers: 4,
};

/// The traced check of TinyLM, named `name`.
pub fn layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.TinyLM")
        .init("vocab", CONFIG.vocab)
        .init("d_model", CONFIG.d_model)
        .init("n_heads", CONFIG.n_heads)
        .init("hidden", CONFIG.hidden)
        .init("n_layers", CONFIG.n_layers)
        .dim("b", 1, 2)
        .dim("t", 1, 12)
        .arg(
            "ids",
            [DimExpr::Sym("b".into()), DimExpr::Sym("t".into())],
            Dist::int(0i64, CONFIG.vocab as i64),
        )
        .cases(8)
        .trace()
}

/// The zoo's transformer block, untraced: its taps must do nothing.
pub fn untraced_block_layer() -> Layer {
    Layer::module("t_untraced_block", "zoo_ref.TransformerBlock")
        .init("d_model", 32usize)
        .init("n_heads", 4usize)
        .init("hidden", 64usize)
        .dim("b", 1, 2)
        .dim("t", 1, 4)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(32)],
            Dist::default(),
        )
        .cases(4)
}
