//! A whole model in module form, checked with `trace`: token embedding → transformer blocks →
//! final LayerNorm → vocabulary head. Its parts tap their outputs (`blocks.rs`), so the check
//! compares every tapped point with the reference's submodule of the same name; a port that
//! drifts is caught where it first leaves the reference (`tests/trace.rs` plants a bug in block 2).

use crate::blocks::{Norm, TransformerBlock};
use candle_core::{Module, Result, Tensor};
use candle_nn::{embedding, linear, Embedding, Linear, VarBuilder};
use golden::golden_layer;

pub struct TinyLm {
    tok: Embedding,
    blocks: Vec<TransformerBlock>,
    ln_f: Norm,
    head: Linear,
}

/// The model's sizes (the reference's constructor arguments).
#[derive(Clone, Copy)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub hidden: usize,
    pub n_layers: usize,
}

impl TinyLm {
    pub fn new(vb: VarBuilder, c: Config) -> Result<Self> {
        let blocks = (0..c.n_layers)
            .map(|i| TransformerBlock::new(vb.pp("blocks").pp(i), c.d_model, c.n_heads, c.hidden))
            .collect::<Result<_>>()?;
        Ok(TinyLm {
            tok: embedding(c.vocab, c.d_model, vb.pp("tok"))?,
            blocks,
            ln_f: Norm::new(vb.pp("ln_f"), c.d_model)?,
            head: linear(c.d_model, c.vocab, vb.pp("head"))?,
        })
    }

    /// The deliberately wrong model of `tests/trace.rs`: block `i` attends to the future.
    pub fn with_bug_in_block(mut self, i: usize) -> Self {
        let block = self.blocks.remove(i);
        self.blocks.insert(i, block.without_causal_mask());
        self
    }

    /// The deliberately slow model of `tests/speed.rs`: block `i`'s MLP makes `copies` copies of
    /// its hidden activations that nothing needs. Its numbers are right; only its speed shows it.
    pub fn with_copies_in_block(mut self, i: usize, copies: usize) -> Self {
        let block = self.blocks.remove(i);
        self.blocks.insert(i, block.with_copies(copies));
        self
    }
}

impl Module for TinyLm {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = self.tok.forward(ids)?;
        golden::tap("tok", &x);
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        let logits = self.head.forward(&self.ln_f.forward(&x)?)?;
        golden::tap("head", &logits);
        Ok(logits)
    }
}

#[golden_layer(
    trace,
    reference = "zoo_ref.TinyLM",
    dims(b = 1..=2, t = 1..=12),
    args(ids = [b, t] ~ int(0..64)),
    init(vocab = 64, d_model = 32, n_heads = 4, hidden = 64, n_layers = 4),
    // Each case's store entry holds the model's state_dict (~200 KB): 8 keep it under 2 MB.
    cases = 8,
)]
pub fn tiny_lm(
    vb: VarBuilder,
    ids: &Tensor,
    vocab: usize,
    d_model: usize,
    n_heads: usize,
    hidden: usize,
    n_layers: usize,
) -> Result<Tensor> {
    let config = Config {
        vocab,
        d_model,
        n_heads,
        hidden,
        n_layers,
    };
    TinyLm::new(vb, config)?.forward(ids)
}
