//! A candle port of Hugging Face's Llama decoder layer (`llama_ref.DecoderLayer`: RMSNorm,
//! attention with rotary embeddings and grouped key/value heads, SwiGLU MLP) at any size, for the
//! gradient check of a real decoder layer (`cargo xtask bench-scale`, `zoo/tests/gradients_at_size.rs`).
//! Written with candle's ops that have a backward; a `Variant` swaps one step for candle's fused
//! op, which has none (BRIEF.md §5), as a porter reaching for the fast path would, or for a
//! hand-written SiLU whose backward is wrong.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};
use candle_nn::VarBuilder;

/// The layer's sizes (`llama_ref.DecoderLayer`'s `init`).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
}

impl Dims {
    /// SmolLM2-135M's decoder layer.
    pub const SMOLLM2: Dims = Dims {
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        intermediate: 1536,
    };
    /// Qwen2.5-0.5B's sizes (Llama's layer: without Qwen2's projection biases).
    pub const QWEN25: Dims = Dims {
        hidden: 896,
        heads: 14,
        kv_heads: 2,
        intermediate: 4864,
    };

    fn head_dim(self) -> usize {
        self.hidden / self.heads
    }
}

/// How the port differs from a faithful one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    /// It does not: every step has a (right) backward.
    #[default]
    Faithful,
    /// The norms take `candle_nn::ops::rms_norm`, which has no backward.
    FusedRmsNorm,
    /// The rotary embedding takes `candle_nn::rotary_emb::rope`, which has no backward.
    FusedRope,
    /// The attention's softmax takes `candle_nn::ops::softmax_last_dim`, which has no backward.
    FusedSoftmax,
    /// The MLP's SiLU is hand-written, with the common wrong backward `σ(x) · grad`.
    SiluSigmoidBackward,
}

impl Variant {
    /// By the name the benchmark's command line gives it.
    pub fn parse(name: &str) -> Option<Variant> {
        Some(match name {
            "faithful" => Variant::Faithful,
            "rms_norm" => Variant::FusedRmsNorm,
            "rope" => Variant::FusedRope,
            "softmax" => Variant::FusedSoftmax,
            "silu_backward" => Variant::SiluSigmoidBackward,
            _ => return None,
        })
    }
}

/// SiLU with the common wrong backward `σ(x) · grad` (the derivative of x·σ(x) is
/// `σ(x)·(1 + x·(1 − σ(x)))`).
pub struct SiluSigmoidBackward;

impl CustomOp1 for SiluSigmoidBackward {
    fn name(&self) -> &'static str {
        "silu-sigmoid-backward"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("silu: contiguous input only".into()))?;
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(
                v[start..end]
                    .iter()
                    .map(|x| x / (1.0 + (-x).exp()))
                    .collect(),
            ),
            CpuStorage::F64(v) => CpuStorage::F64(
                v[start..end]
                    .iter()
                    .map(|x| x / (1.0 + (-x).exp()))
                    .collect(),
            ),
            _ => candle_core::bail!("silu: f32 or f64 only"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some((candle_nn::ops::sigmoid(arg)? * grad_res)?))
    }
}

const EPS: f64 = 1e-6;
const THETA: f64 = 10_000.0;

fn linear(vb: &VarBuilder, name: &str, x: &Tensor, out: usize, inp: usize) -> Result<Tensor> {
    let w = vb.get((out, inp), &format!("{name}.weight"))?;
    let y = x.broadcast_matmul(&w.t()?)?;
    golden::tap(format!("{}.{name}", vb.prefix()), &y);
    Ok(y)
}

/// LlamaRMSNorm (in the input's dtype: f32 checked in f32, f64 by finite differences).
fn rms_norm(
    vb: &VarBuilder,
    name: &str,
    x: &Tensor,
    dims: Dims,
    variant: Variant,
) -> Result<Tensor> {
    let w = vb.get(dims.hidden, &format!("{name}.weight"))?;
    let y = if variant == Variant::FusedRmsNorm {
        candle_nn::ops::rms_norm(&x.contiguous()?, &w, EPS as f32)?
    } else {
        let variance = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(variance + EPS)?.sqrt()?)?
            .broadcast_mul(&w)?
    };
    golden::tap(format!("{}.{name}", vb.prefix()), &y);
    Ok(y)
}

/// The rotary embedding's cos and sin for `t` positions, [t, head_dim / 2].
fn rotary(
    t: usize,
    head_dim: usize,
    dtype: DType,
    device: &candle_core::Device,
) -> Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..head_dim / 2)
        .map(|i| (1.0 / THETA.powf(2.0 * i as f64 / head_dim as f64)) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, head_dim / 2), device)?;
    let positions = Tensor::arange(0u32, t as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((t, 1))?;
    let freqs = positions.broadcast_mul(&inv)?;
    Ok((freqs.cos()?.to_dtype(dtype)?, freqs.sin()?.to_dtype(dtype)?))
}

/// `x·cos + rotate_half(x)·sin` over halves, for x [b, h, t, d].
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, variant: Variant) -> Result<Tensor> {
    if variant == Variant::FusedRope {
        return candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin);
    }
    let d = x.dim(D::Minus1)?;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

fn attention(vb: &VarBuilder, x: &Tensor, dims: Dims, variant: Variant) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let hd = dims.head_dim();
    let heads = |y: Tensor, n: usize| y.reshape((b, t, n, hd))?.transpose(1, 2);
    let q = heads(
        linear(vb, "q_proj", x, dims.heads * hd, dims.hidden)?,
        dims.heads,
    )?;
    let k = heads(
        linear(vb, "k_proj", x, dims.kv_heads * hd, dims.hidden)?,
        dims.kv_heads,
    )?;
    let v = heads(
        linear(vb, "v_proj", x, dims.kv_heads * hd, dims.hidden)?,
        dims.kv_heads,
    )?;
    let (cos, sin) = rotary(t, hd, x.dtype(), x.device())?;
    let q = rope(&q, &cos, &sin, variant)?;
    let k = rope(&k, &cos, &sin, variant)?;
    golden::tap("q_rot", &q);
    golden::tap("k_rot", &k);
    // Grouped key/value heads: each serves heads / kv_heads query heads.
    let repeat = |y: Tensor| -> Result<Tensor> {
        let n = dims.heads / dims.kv_heads;
        y.unsqueeze(2)?
            .expand((b, dims.kv_heads, n, t, hd))?
            .reshape((b, dims.heads, t, hd))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
    let mask: Vec<u8> = (0..t)
        .flat_map(|i| (0..t).map(move |j| u8::from(j > i)))
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), x.device())?.broadcast_as(scores.shape())?;
    let blocked =
        Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?.to_dtype(scores.dtype())?;
    let scores = mask.where_cond(&blocked, &scores)?;
    let weights = if variant == Variant::FusedSoftmax {
        candle_nn::ops::softmax_last_dim(&scores)?
    } else {
        candle_nn::ops::softmax(&scores, D::Minus1)?
    };
    let out = weights
        .matmul(&v.contiguous()?)?
        .transpose(1, 2)?
        .reshape((b, t, dims.heads * hd))?;
    let out = linear(vb, "o_proj", &out, dims.hidden, dims.heads * hd)?;
    Ok(out)
}

fn mlp(vb: &VarBuilder, x: &Tensor, dims: Dims, variant: Variant) -> Result<Tensor> {
    let gate = linear(vb, "gate_proj", x, dims.intermediate, dims.hidden)?;
    let up = linear(vb, "up_proj", x, dims.intermediate, dims.hidden)?;
    let act = if variant == Variant::SiluSigmoidBackward {
        gate.contiguous()?.apply_op1(SiluSigmoidBackward)?
    } else {
        gate.silu()?
    };
    linear(
        vb,
        "down_proj",
        &(act * up)?,
        dims.hidden,
        dims.intermediate,
    )
}

/// The decoder layer on x [b, t, hidden]: the hidden states after it.
pub fn decoder(vb: VarBuilder, x: &Tensor, dims: Dims, variant: Variant) -> Result<Tensor> {
    let vb = vb.pp("layer");
    let h = rms_norm(&vb, "input_layernorm", x, dims, variant)?;
    let x = (x + attention(&vb.pp("self_attn"), &h, dims, variant)?)?;
    let h = rms_norm(&vb, "post_attention_layernorm", &x, dims, variant)?;
    &x + mlp(&vb.pp("mlp"), &h, dims, variant)?
}

/// The check of the decoder layer against `llama_ref.DecoderLayer` at `dims` on `tokens`
/// positions, a batch of one.
pub fn layer(name: &str, dims: Dims, tokens: usize) -> golden::Layer {
    golden::Layer::module(name, "llama_ref.DecoderLayer")
        .init("hidden", dims.hidden)
        .init("heads", dims.heads)
        .init("kv_heads", dims.kv_heads)
        .init("intermediate", dims.intermediate)
        .dim("b", 1, 1)
        .dim("t", tokens, tokens)
        .arg(
            "x",
            [
                golden::DimExpr::from("b"),
                golden::DimExpr::from("t"),
                golden::DimExpr::Lit(dims.hidden),
            ],
            golden::Dist::default(),
        )
}
