//! A candle port of Hugging Face's Llama decoder layer (`llama_ref.DecoderLayer`: RMSNorm,
//! attention with rotary embeddings and grouped key/value heads, SwiGLU MLP), written as a user
//! porting Llama would, with `golden::tap` at the points a trace compares; and the layers of its
//! checks. Used by `tests/trace.rs`, `tests/gradients.rs` and (the attention) `tests/verdicts.rs`;
//! their golden stores are in `tests/golden/`.

use candle_core::{DType, Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::{DimExpr, Dist, Layer};

pub const HIDDEN: usize = 16;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = HIDDEN / HEADS;
pub const INTERMEDIATE: usize = 32;

/// How the port differs from a faithful one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Port {
    /// Rotate interleaved pairs (GPT-J's rotary) where Llama rotates halves.
    pub rope_on_pairs: bool,
    /// Tap the attention's output as `layer.self_attn` (its module's name) rather than as the
    /// reference's point `layer.self_attn.0`.
    pub tap_attention_as_module: bool,
    /// Tap the rotated queries and keys (`q_rot`, `k_rot`, which the reference taps itself).
    pub tap_rotary: bool,
    /// Tap the MLP's activation (`layer.mlp.act_fn`, a submodule of the reference).
    pub tap_activation: bool,
    /// The MLP's activation leaks float32: SiLU computed in float32 and carried through the down
    /// projection, cast back to the input's dtype only at the residual.
    pub activation_leaks_f32: bool,
    /// The rotary embedding in float32: its tables never cast to the input's dtype, the queries
    /// and keys upcast to meet them, and the attention computed in float32 up to its projection.
    pub rotary_in_f32: bool,
}

/// The traced check of the decoder layer against `llama_ref.DecoderLayer`.
pub fn decoder_layer(name: &str) -> Layer {
    Layer::module(name, "llama_ref.DecoderLayer")
        .init("hidden", HIDDEN)
        .init("heads", HEADS)
        .init("kv_heads", KV_HEADS)
        .init("intermediate", INTERMEDIATE)
        .dim("b", 1, 2)
        .dim("t", 1, 6)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(HIDDEN)],
            Dist::default(),
        )
        .cases(8)
        .trace()
}

/// `x @ weightᵀ` for a bias-free Linear named `name` under `vb`.
pub fn linear(vb: &VarBuilder, name: &str, x: &Tensor, out: usize, inp: usize) -> Result<Tensor> {
    let w = vb.get((out, inp), &format!("{name}.weight"))?;
    let y = x.broadcast_matmul(&w.t()?)?;
    golden::tap(format!("{}.{name}", vb.prefix()), &y);
    Ok(y)
}

/// LlamaRMSNorm: in float32 whatever the input's dtype, then the weight in the input's dtype.
fn rms_norm(vb: &VarBuilder, name: &str, x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let h = x.to_dtype(DType::F32.max_with(dtype))?;
    let variance = h.sqr()?.mean_keepdim(D::Minus1)?;
    let h = h
        .broadcast_div(&(variance + 1e-6)?.sqrt()?)?
        .to_dtype(dtype)?;
    let y = h.broadcast_mul(&vb.get(HIDDEN, &format!("{name}.weight"))?)?;
    golden::tap(format!("{}.{name}", vb.prefix()), &y);
    Ok(y)
}

/// The wider of two float dtypes (so that float32 steps do not truncate a float64 run).
trait Wider {
    fn max_with(self, other: DType) -> DType;
}

impl Wider for DType {
    fn max_with(self, other: DType) -> DType {
        if self.size_in_bytes() >= other.size_in_bytes() {
            self
        } else {
            other
        }
    }
}

/// `rotate_half`: `(x1, x2) -> (-x2, x1)` over the last axis's halves; on pairs,
/// `(a, b) -> (-b, a)` for each interleaved pair.
fn rotate(x: &Tensor, on_pairs: bool) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    if on_pairs {
        let mut dims = x.dims().to_vec();
        dims.pop();
        let pairs = x.reshape([&dims[..], &[d / 2, 2]].concat())?;
        let a = pairs.narrow(D::Minus1, 0, 1)?;
        let b = pairs.narrow(D::Minus1, 1, 1)?;
        return Tensor::cat(&[&b.neg()?, &a], D::Minus1)?.reshape(x.shape());
    }
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// The attention's output (before the residual).
pub fn attention(vb: &VarBuilder, x: &Tensor, port: Port) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let heads = |y: Tensor, n: usize| y.reshape((b, t, n, HEAD_DIM))?.transpose(1, 2);
    let q = heads(linear(vb, "q_proj", x, HEADS * HEAD_DIM, HIDDEN)?, HEADS)?;
    let k = heads(
        linear(vb, "k_proj", x, KV_HEADS * HEAD_DIM, HIDDEN)?,
        KV_HEADS,
    )?;
    let v = heads(
        linear(vb, "v_proj", x, KV_HEADS * HEAD_DIM, HIDDEN)?,
        KV_HEADS,
    )?;
    // Rotary embeddings as LlamaRotaryEmbedding computes them (float32, then the input's dtype),
    // the frequencies duplicated over the two halves.
    let inv_freq: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|j| 1.0 / 10000f32.powf(2.0 * j as f32 / HEAD_DIM as f32))
        .collect();
    let positions: Vec<f32> = (0..t).map(|p| p as f32).collect();
    let freqs = Tensor::new(positions, x.device())?
        .unsqueeze(1)?
        .matmul(&Tensor::new(inv_freq, x.device())?.unsqueeze(0)?)?;
    let emb = if port.rope_on_pairs {
        // Each frequency twice in a row, for interleaved pairs.
        freqs
            .unsqueeze(D::Minus1)?
            .repeat((1, 1, 2))?
            .reshape((t, HEAD_DIM))?
    } else {
        Tensor::cat(&[&freqs, &freqs], D::Minus1)?
    };
    let (cos, sin) = if port.rotary_in_f32 {
        (emb.cos()?, emb.sin()?)
    } else {
        (
            emb.cos()?.to_dtype(x.dtype())?,
            emb.sin()?.to_dtype(x.dtype())?,
        )
    };
    let (q, k, v) = if port.rotary_in_f32 {
        let up = |t: Tensor| t.to_dtype(DType::F32);
        (up(q)?, up(k)?, up(v)?)
    } else {
        (q, k, v)
    };
    let rope = |x: &Tensor| -> Result<Tensor> {
        x.broadcast_mul(&cos)?
            .add(&rotate(x, port.rope_on_pairs)?.broadcast_mul(&sin)?)
    };
    let (q, k) = (rope(&q)?, rope(&k)?);
    if port.tap_rotary {
        golden::tap("q_rot", &q);
        golden::tap("k_rot", &k);
    }
    // Each key/value head serves HEADS / KV_HEADS consecutive query heads (repeat_kv).
    let repeat = |x: Tensor| -> Result<Tensor> {
        x.unsqueeze(2)?
            .expand((b, KV_HEADS, HEADS / KV_HEADS, t, HEAD_DIM))?
            .reshape((b, HEADS, t, HEAD_DIM))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.matmul(&k.t()?)? / (HEAD_DIM as f64).sqrt())?;
    let mask: Vec<u8> = (0..t)
        .flat_map(|r| (0..t).map(move |c| u8::from(c > r)))
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), x.device())?.broadcast_as(scores.shape())?;
    let scores = mask.where_cond(
        &Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?.to_dtype(scores.dtype())?,
        &scores,
    )?;
    let dtype = scores.dtype();
    let probs = candle_nn::ops::softmax(&scores.to_dtype(DType::F32.max_with(dtype))?, D::Minus1)?
        .to_dtype(dtype)?;
    let out = probs
        .matmul(&v.contiguous()?)?
        .transpose(1, 2)?
        .reshape((b, t, HIDDEN))?
        .to_dtype(x.dtype())?;
    let out = linear(vb, "o_proj", &out, HIDDEN, HIDDEN)?;
    let name = if port.tap_attention_as_module {
        vb.prefix()
    } else {
        format!("{}.0", vb.prefix())
    };
    golden::tap(name, &out);
    Ok(out)
}

/// The SwiGLU MLP, with `silu` as given (candle's, or a custom op).
pub fn mlp(
    vb: &VarBuilder,
    x: &Tensor,
    silu: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let gate = linear(vb, "gate_proj", x, INTERMEDIATE, HIDDEN)?;
    let up = linear(vb, "up_proj", x, INTERMEDIATE, HIDDEN)?;
    let y = linear(vb, "down_proj", &(silu(&gate)? * up)?, HIDDEN, INTERMEDIATE)?;
    golden::tap(vb.prefix(), &y);
    Ok(y)
}

/// The decoder layer: pre-norm attention and MLP, each with its residual.
pub fn decoder(vb: VarBuilder, x: &Tensor, port: Port) -> Result<Tensor> {
    decoder_with_silu(vb, x, port, candle_nn::ops::silu)
}

/// [`decoder`] with the MLP's activation given.
pub fn decoder_with_silu(
    vb: VarBuilder,
    x: &Tensor,
    port: Port,
    silu: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let vb = vb.pp("layer");
    let h = (x + attention(
        &vb.pp("self_attn"),
        &rms_norm(&vb, "input_layernorm", x)?,
        port,
    )?)?;
    let normed = rms_norm(&vb, "post_attention_layernorm", &h)?;
    let mlp_vb = vb.pp("mlp");
    let tap_activation = port.tap_activation;
    let activation = |g: &Tensor| -> Result<Tensor> {
        let a = if port.activation_leaks_f32 {
            silu(&g.to_dtype(DType::F32)?)?
        } else {
            silu(g)?
        };
        if tap_activation {
            golden::tap(format!("{}.act_fn", mlp_vb.prefix()), &a);
        }
        Ok(a)
    };
    let y = if port.activation_leaks_f32 {
        // The product and the down projection follow the activation's float32.
        let gate = linear(&mlp_vb, "gate_proj", &normed, INTERMEDIATE, HIDDEN)?;
        let up = linear(&mlp_vb, "up_proj", &normed, INTERMEDIATE, HIDDEN)?;
        let inner = (activation(&gate)? * up.to_dtype(DType::F32)?)?;
        let w = mlp_vb.get((HIDDEN, INTERMEDIATE), "down_proj.weight")?;
        let down = inner.broadcast_matmul(&w.to_dtype(DType::F32)?.t()?)?;
        golden::tap(format!("{}.down_proj", mlp_vb.prefix()), &down);
        let y = down.to_dtype(normed.dtype())?;
        golden::tap(mlp_vb.prefix(), &y);
        y
    } else {
        mlp(&mlp_vb, &normed, activation)?
    };
    let out = (&h + y)?;
    golden::tap(vb.prefix(), &out);
    Ok(out)
}
