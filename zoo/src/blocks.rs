//! Module form: candle-nn ports of `nn.Module`s, built from the reference's own `state_dict()`.
//!
//! Each part taps its output under its `VarBuilder` path (`golden::tap`), so that a model built from
//! them can be traced against the reference's submodules (`model.rs`); outside a traced check a
//! tap does nothing.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{linear, LayerNorm, Linear, VarBuilder};
use golden::golden_layer;

/// Linear → GELU → Linear.
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
    name: String,
    /// Extra copies of the hidden activations: 0 but in `tests/speed.rs`'s deliberately slow
    /// model.
    copies: usize,
}

impl Mlp {
    pub fn new(vb: VarBuilder, d_model: usize, hidden: usize) -> Result<Self> {
        Ok(Mlp {
            fc1: linear(d_model, hidden, vb.pp("fc1"))?,
            fc2: linear(hidden, d_model, vb.pp("fc2"))?,
            name: vb.prefix(),
            copies: 0,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.fc1.forward(x)?.gelu_erf()?;
        for _ in 0..self.copies {
            h = h.copy()?;
        }
        let y = self.fc2.forward(&h)?;
        golden::tap(&self.name, &y);
        Ok(y)
    }
}

#[golden_layer(
    grad,
    overfit,
    reference = "zoo_ref.MLP",
    dims(b = 1..=4, t = 1..=16),
    args(x = [b, t, 32]),
    init(d_model = 32, hidden = 64),
)]
pub fn mlp(vb: VarBuilder, x: &Tensor, d_model: usize, hidden: usize) -> Result<Tensor> {
    Mlp::new(vb, d_model, hidden)?.forward(x)
}

/// `nn.LayerNorm` with the differentiable formula (LayerNorm::forward takes the fused path).
pub struct Norm(LayerNorm, String);

impl Norm {
    pub fn new(vb: VarBuilder, d: usize) -> Result<Self> {
        let name = vb.prefix();
        Ok(Norm(candle_nn::layer_norm(d, 1e-5, vb)?, name))
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        let bias = self.0.bias().expect("nn.LayerNorm has a bias");
        let y = normed.broadcast_mul(self.0.weight())?.broadcast_add(bias)?;
        golden::tap(&self.1, &y);
        Ok(y)
    }
}

pub struct CausalSelfAttention {
    qkv: Linear,
    proj: Linear,
    n_heads: usize,
    /// Always true but in `tests/trace.rs`'s deliberately wrong model.
    causal: bool,
    names: [String; 3],
}

impl CausalSelfAttention {
    pub fn new(vb: VarBuilder, d_model: usize, n_heads: usize) -> Result<Self> {
        Ok(CausalSelfAttention {
            qkv: linear(d_model, 3 * d_model, vb.pp("qkv"))?,
            proj: linear(d_model, d_model, vb.pp("proj"))?,
            n_heads,
            causal: true,
            names: [vb.prefix(), vb.pp("qkv").prefix(), vb.pp("proj").prefix()],
        })
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let h = self.n_heads;
        let qkv = self.qkv.forward(x)?;
        golden::tap(&self.names[1], &qkv);
        let heads = |i: usize| -> Result<Tensor> {
            qkv.narrow(D::Minus1, i * d, d)?
                .reshape((b, t, h, d / h))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scores = (q.matmul(&k.t()?)? / ((d / h) as f64).sqrt())?;
        let mask = if self.causal {
            Tensor::tril2(t, DType::U8, x.device())?
        } else {
            Tensor::ones((t, t), DType::U8, x.device())?
        }
        .broadcast_as(scores.shape())?;
        let neg_inf = Tensor::new(f32::NEG_INFINITY, x.device())?
            .to_dtype(scores.dtype())?
            .broadcast_as(scores.shape())?;
        let probs = candle_nn::ops::softmax(&mask.where_cond(&scores, &neg_inf)?, D::Minus1)?;
        let y = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, d))?;
        let y = self.proj.forward(&y)?;
        golden::tap(&self.names[2], &y);
        golden::tap(&self.names[0], &y);
        Ok(y)
    }
}

/// Pre-norm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
pub struct TransformerBlock {
    ln1: Norm,
    attn: CausalSelfAttention,
    ln2: Norm,
    mlp: Mlp,
    name: String,
}

impl TransformerBlock {
    pub fn new(vb: VarBuilder, d_model: usize, n_heads: usize, hidden: usize) -> Result<Self> {
        Ok(TransformerBlock {
            ln1: Norm::new(vb.pp("ln1"), d_model)?,
            attn: CausalSelfAttention::new(vb.pp("attn"), d_model, n_heads)?,
            ln2: Norm::new(vb.pp("ln2"), d_model)?,
            mlp: Mlp::new(vb.pp("mlp"), d_model, hidden)?,
            name: vb.prefix(),
        })
    }

    /// The deliberately wrong block of `tests/trace.rs`: attention without its causal mask.
    pub fn without_causal_mask(mut self) -> Self {
        self.attn.causal = false;
        self
    }

    /// The deliberately slow block of `tests/speed.rs`: its MLP copies its hidden activations
    /// `copies` times, where no copy is needed (a right port, only slower).
    pub fn with_copies(mut self, copies: usize) -> Self {
        self.mlp.copies = copies;
        self
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = (x + self.attn.forward(&self.ln1.forward(x)?)?)?;
        let y = (&x + self.mlp.forward(&self.ln2.forward(&x)?)?)?;
        golden::tap(&self.name, &y);
        Ok(y)
    }
}

#[golden_layer(
    grad,
    overfit,
    reference = "zoo_ref.TransformerBlock",
    dims(b = 1..=3, t = 1..=16),
    args(x = [b, t, 32]),
    init(d_model = 32, n_heads = 4, hidden = 64),
)]
pub fn transformer_block(
    vb: VarBuilder,
    x: &Tensor,
    d_model: usize,
    n_heads: usize,
    hidden: usize,
) -> Result<Tensor> {
    TransformerBlock::new(vb, d_model, n_heads, hidden)?.forward(x)
}
