//! `LlamaModel` with one decoder layer: token embedding, then (RMSNorm, attention with rotary
//! position embeddings and grouped KV heads) and (RMSNorm, SwiGLU MLP) as residual blocks, then
//! the final RMSNorm.

use crate::mlp::Mlp;
use crate::norm::RmsNorm;
use candle_core::{Device, Module, Result, Tensor};
use candle_nn::{embedding, linear_b, VarBuilder};
use golden::golden_layer;
use std::collections::BTreeMap;

/// How the rotary embedding is applied to `[b, heads, t, head_dim]` with `[t, head_dim / 2]`
/// tables: `candle_nn::rotary_emb::rope` (halves, as Llama) or `rope_i` (interleaved pairs).
pub type Rope = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

/// The sizes of a Llama model, as its `LlamaConfig` gives them.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// The MLP's intermediate size.
    pub intermediate: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (grouped-query attention: fewer than `heads`).
    pub kv_heads: usize,
    /// Size of one head (the configuration's `head_dim`: not always `hidden / heads`).
    pub head_dim: usize,
    /// Whether the attention's projections have biases (`attention_bias`).
    pub attention_bias: bool,
}

/// Hugging Face's default rope_theta and RMSNorm eps.
const ROPE_THETA: f32 = 10_000.0;
const EPS: f64 = 1e-6;

/// cos and sin of positions `0..t`, `[t, head_dim / 2]`, in float32 as LlamaRotaryEmbedding
/// computes them.
fn rope_tables(t: usize, head_dim: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / ROPE_THETA.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let freqs: Vec<f32> = (0..t)
        .flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f))
        .collect();
    let freqs = Tensor::from_vec(freqs, (t, head_dim / 2), device)?;
    Ok((freqs.cos()?, freqs.sin()?))
}

/// `LlamaAttention` with a causal mask.
fn attention(vb: VarBuilder, x: &Tensor, s: &Sizes, rope: Rope) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let name = vb.prefix();
    let proj = |out: usize, what: &str| linear_b(s.hidden, out, s.attention_bias, vb.pp(what));
    let (q_proj, k_proj) = (
        proj(s.heads * s.head_dim, "q_proj")?,
        proj(s.kv_heads * s.head_dim, "k_proj")?,
    );
    let v_proj = proj(s.kv_heads * s.head_dim, "v_proj")?;
    let o_proj = linear_b(
        s.heads * s.head_dim,
        s.hidden,
        s.attention_bias,
        vb.pp("o_proj"),
    )?;
    let heads = |x: Tensor, n: usize| {
        x.reshape((b, t, n, s.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    };
    let q = q_proj.forward(x)?;
    let k = k_proj.forward(x)?;
    let v = v_proj.forward(x)?;
    golden::tap(&format!("{name}.q_proj"), &q);
    golden::tap(&format!("{name}.k_proj"), &k);
    golden::tap(&format!("{name}.v_proj"), &v);
    let (q, k, v) = (
        heads(q, s.heads)?,
        heads(k, s.kv_heads)?,
        heads(v, s.kv_heads)?,
    );
    let (cos, sin) = rope_tables(t, s.head_dim, x.device())?;
    let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
    let (q, k) = (rope(&q, &cos, &sin)?, rope(&k, &cos, &sin)?);
    // Grouped KV heads: query head j reads KV head j / (heads / kv_heads), as repeat_kv.
    let repeat = |x: Tensor| -> Result<Tensor> {
        let n_rep = s.heads / s.kv_heads;
        x.unsqueeze(2)?
            .expand((b, s.kv_heads, n_rep, t, s.head_dim))?
            .reshape((b, s.heads, t, s.head_dim))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.matmul(&k.t()?)? * (s.head_dim as f64).powf(-0.5))?;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), x.device())?.to_dtype(x.dtype())?;
    let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    let out = probs
        .matmul(&v)?
        .transpose(1, 2)?
        .reshape((b, t, s.heads * s.head_dim))?;
    let out = o_proj.forward(&out)?;
    golden::tap(&format!("{name}.o_proj"), &out);
    Ok(out)
}

/// The model's last hidden state, with the rotary embedding applied by `rope`.
pub fn llama_model_with(
    vb: VarBuilder,
    input_ids: &Tensor,
    s: &Sizes,
    rope: Rope,
) -> Result<Tensor> {
    let embed = embedding(s.vocab, s.hidden, vb.pp("embed_tokens"))?;
    let mut h = embed.forward(input_ids)?;
    golden::tap("embed_tokens", &h);
    let layer = vb.pp("layers").pp(0);
    let input_norm = RmsNorm::new(layer.pp("input_layernorm"), s.hidden, EPS)?.forward(&h)?;
    golden::tap("layers.0.input_layernorm", &input_norm);
    h = (h + attention(layer.pp("self_attn"), &input_norm, s, rope)?)?;
    let post_norm =
        RmsNorm::new(layer.pp("post_attention_layernorm"), s.hidden, EPS)?.forward(&h)?;
    golden::tap("layers.0.post_attention_layernorm", &post_norm);
    let mlp = Mlp::new(layer.pp("mlp"), s.hidden, s.intermediate)?.forward(&post_norm)?;
    golden::tap("layers.0.mlp", &mlp);
    h = (h + mlp)?;
    golden::tap("layers.0", &h);
    let out = RmsNorm::new(vb.pp("norm"), s.hidden, EPS)?.forward(&h)?;
    golden::tap("norm", &out);
    Ok(out)
}

/// The check: `transformers.LlamaModel` with one decoder layer, 2·kv query heads sharing kv KV
/// heads (GQA), the model's `last_hidden_state` and every submodule's output (`trace`), in float32
/// and bfloat16. Its configuration is swept: a head size that is `hidden / heads` (8) or not (16),
/// and projections with biases or without (`one_of`: each case draws one, and the cases cover
/// every pair).
#[golden_layer(
    reference = "transformers.LlamaModel",
    config = "transformers.LlamaConfig"(
        vocab_size = 64,
        hidden_size = 16 * kv,
        intermediate_size = 48,
        num_hidden_layers = 1,
        num_attention_heads = 2 * kv,
        num_key_value_heads = kv,
        head_dim = one_of(8, 16),
        attention_bias = one_of(false, true),
        max_position_embeddings = 64,
        use_cache = false,
    ),
    dims(b = 1..=2, t = 1..=8, kv = 1..=2),
    args(input_ids = [b, t] ~ int(0..64)),
    dtypes = [f32, bf16],
    trace,
    cases = 16,
)]
#[allow(clippy::too_many_arguments)]
pub fn llama_model(
    vb: VarBuilder,
    input_ids: &Tensor,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    attention_bias: bool,
) -> Result<BTreeMap<&'static str, Tensor>> {
    let sizes = Sizes {
        vocab: vocab_size,
        hidden: hidden_size,
        intermediate: intermediate_size,
        heads: num_attention_heads,
        kv_heads: num_key_value_heads,
        head_dim,
        attention_bias,
    };
    let out = llama_model_with(vb, input_ids, &sizes, candle_nn::rotary_emb::rope)?;
    // `LlamaModel` returns a `BaseModelOutputWithPast`, a dict: its leaves are named by key.
    Ok(BTreeMap::from([("last_hidden_state", out)]))
}
