//! `LlamaForCausalLM` with a KV cache: the model a port generates text with, one token at a time.
//!
//! The checks drive it through schedules that golden draws (`decode(...)`): a prefill, then
//! one-token steps or chunks of several tokens on the cache, in padded batches, with greedy
//! generation — against the real `transformers.LlamaForCausalLM` driven the same way with its own
//! `DynamicCache`. The function builds the model and returns a closure that golden calls once per
//! step; the cache lives in the closure.

use crate::mlp::Mlp;
use crate::norm::RmsNorm;
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{embedding, linear_no_bias, Embedding, Linear, VarBuilder};
use golden::{golden_layer, Step};
use std::collections::BTreeMap;

/// The sizes of the model, as its `LlamaConfig` gives them.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// The MLP's intermediate size.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (GQA).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// `rms_norm_eps`.
    pub eps: f64,
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// The keys and values of every position so far, `[b, kv_heads, positions, head_dim]`.
    cache: Option<(Tensor, Tensor)>,
}

struct Layer {
    input_norm: RmsNorm,
    attention: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// The model and its cache.
pub struct CausalLm {
    config: Config,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl CausalLm {
    /// The model, its weights read from `vb` under Hugging Face's names.
    pub fn new(vb: VarBuilder, config: Config) -> Result<Self> {
        let c = config;
        let m = vb.pp("model");
        let layers = (0..c.layers)
            .map(|i| {
                let l = m.pp("layers").pp(i);
                let a = l.pp("self_attn");
                let proj = |inp, out, name| linear_no_bias(inp, out, a.pp(name));
                Ok(Layer {
                    input_norm: RmsNorm::new(l.pp("input_layernorm"), c.hidden, c.eps)?,
                    attention: Attention {
                        q: proj(c.hidden, c.heads * c.head_dim, "q_proj")?,
                        k: proj(c.hidden, c.kv_heads * c.head_dim, "k_proj")?,
                        v: proj(c.hidden, c.kv_heads * c.head_dim, "v_proj")?,
                        o: proj(c.heads * c.head_dim, c.hidden, "o_proj")?,
                        cache: None,
                    },
                    post_norm: RmsNorm::new(l.pp("post_attention_layernorm"), c.hidden, c.eps)?,
                    mlp: Mlp::new(l.pp("mlp"), c.hidden, c.intermediate)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CausalLm {
            config,
            embed: embedding(c.vocab, c.hidden, m.pp("embed_tokens"))?,
            layers,
            norm: RmsNorm::new(m.pp("norm"), c.hidden, c.eps)?,
            lm_head: linear_no_bias(c.hidden, c.vocab, vb.pp("lm_head"))?,
        })
    }

    /// The logits `[b, t, vocab]` of `input_ids` `[b, t]` at `positions` `[b, t]`, attending to
    /// the cached positions and these; `mask` `[b, cached + t]` (1 valid, 0 padding) in a padded
    /// batch.
    pub fn forward(
        &mut self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = self.config;
        let (b, t) = input_ids.dims2()?;
        let mut h = self.embed.forward(input_ids)?;
        let (cos, sin) = rope_tables(positions, c, h.dtype())?;
        for layer in &mut self.layers {
            let x = layer.input_norm.forward(&h)?;
            let a = &mut layer.attention;
            let heads = |y: Tensor, n: usize| -> Result<Tensor> {
                y.reshape((b, t, n, c.head_dim))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = rotate(&heads(a.q.forward(&x)?, c.heads)?, &cos, &sin)?;
            let k = rotate(&heads(a.k.forward(&x)?, c.kv_heads)?, &cos, &sin)?;
            let v = heads(a.v.forward(&x)?, c.kv_heads)?;
            let (k, v) = match a.cache.take() {
                Some((k0, v0)) => (Tensor::cat(&[&k0, &k], 2)?, Tensor::cat(&[&v0, &v], 2)?),
                None => (k, v),
            };
            a.cache = Some((k.clone(), v.clone()));
            let keys = k.dim(2)?;
            let repeat = |x: &Tensor| -> Result<Tensor> {
                x.unsqueeze(2)?
                    .expand((b, c.kv_heads, c.heads / c.kv_heads, keys, c.head_dim))?
                    .reshape((b, c.heads, keys, c.head_dim))
            };
            let scores = (q.matmul(&repeat(&k)?.t()?)? * (c.head_dim as f64).powf(-0.5))?;
            let seen = attends(b, t, keys, mask, scores.device())?;
            let floor = Tensor::full(f32::MIN, scores.shape(), scores.device())?
                .to_dtype(scores.dtype())?;
            let scores = seen
                .broadcast_as(scores.shape())?
                .where_cond(&scores, &floor)?;
            // The softmax in float32, as transformers' attention computes it.
            let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?
                .to_dtype(scores.dtype())?;
            let out = probs.matmul(&repeat(&v)?)?.transpose(1, 2)?.reshape((
                b,
                t,
                c.heads * c.head_dim,
            ))?;
            h = (h + a.o.forward(&out)?)?;
            h = (&h + layer.mlp.forward(&layer.post_norm.forward(&h)?)?)?;
        }
        self.lm_head.forward(&self.norm.forward(&h)?)
    }
}

/// cos and sin `[b, 1, t, head_dim]` of the positions `[b, t]`, computed in float32 as
/// `LlamaRotaryEmbedding` does, then in `dtype`.
fn rope_tables(positions: &Tensor, c: Config, dtype: DType) -> Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..c.head_dim / 2)
        .map(|i| 1.0 / c.rope_theta.powf((2 * i) as f32 / c.head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, 1, c.head_dim / 2), positions.device())?;
    let freqs = positions
        .to_dtype(DType::F32)?
        .unsqueeze(2)?
        .broadcast_mul(&inv)?;
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?.unsqueeze(1)?;
    Ok((emb.cos()?.to_dtype(dtype)?, emb.sin()?.to_dtype(dtype)?))
}

/// `x * cos + rotate_half(x) * sin`.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let (x1, x2) = (
        x.narrow(D::Minus1, 0, half)?,
        x.narrow(D::Minus1, half, half)?,
    );
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// Which keys each of the `t` new queries sees, `[b, 1, t, keys]` u8: the causal mask over all
/// `keys` positions (the last `t` are the new ones), and no padding.
fn attends(
    b: usize,
    t: usize,
    keys: usize,
    mask: Option<&Tensor>,
    device: &Device,
) -> Result<Tensor> {
    let pads: Option<Vec<Vec<u8>>> = mask.map(|m| m.to_vec2::<u8>()).transpose()?;
    let past = keys - t;
    let mut seen = Vec::with_capacity(b * t * keys);
    for row in 0..b {
        for i in 0..t {
            for j in 0..keys {
                let valid = pads.as_ref().is_none_or(|p| p[row][j] == 1);
                seen.push(u8::from(j <= past + i && valid));
            }
        }
    }
    Tensor::from_vec(seen, (b, 1, t, keys), device)
}

/// The check: `transformers.LlamaForCausalLM` (two layers, GQA) driven through schedules — a
/// prefill and one-token steps, chunked prefills, padded batches (left, right, a row of one
/// token) — every step's logits against the reference's cached run and its one-shot forward.
#[golden_layer(
    reference = "transformers.LlamaForCausalLM",
    config = "transformers.LlamaConfig"(
        vocab_size = 64,
        hidden_size = 32,
        intermediate_size = 48,
        num_hidden_layers = 2,
        num_attention_heads = 4,
        num_key_value_heads = 2,
        head_dim = 8,
        max_position_embeddings = 64,
    ),
    dims(b = 1..=3, n = 2..=12),
    args(input_ids = [b, n] ~ int(0..64)),
    decode(padding),
    cases = 16,
)]
#[allow(clippy::too_many_arguments)]
pub fn cached_llama(
    vb: VarBuilder,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
) -> Result<impl FnMut(&Step) -> Result<BTreeMap<&'static str, Tensor>>> {
    let mut model = CausalLm::new(
        vb,
        Config {
            vocab: vocab_size,
            hidden: hidden_size,
            intermediate: intermediate_size,
            layers: num_hidden_layers,
            heads: num_attention_heads,
            kv_heads: num_key_value_heads,
            head_dim,
            rope_theta: 10_000.0,
            eps: 1e-6,
        },
    )?;
    Ok(move |step: &Step| {
        let logits = model.forward(
            step.input("input_ids")?,
            step.positions(),
            step.attention_mask(),
        )?;
        Ok(BTreeMap::from([("logits", logits)]))
    })
}

/// The check of greedy generation: after the prompt, up to 6 tokens, teacher-forced with the
/// reference's tokens (every step's logits compared) and then free-running (the port's own
/// tokens against the reference's), in left-padded batches as `generate` pads them.
#[golden_layer(
    reference = "transformers.LlamaForCausalLM",
    config = "transformers.LlamaConfig"(
        vocab_size = 64,
        hidden_size = 32,
        intermediate_size = 48,
        num_hidden_layers = 2,
        num_attention_heads = 4,
        num_key_value_heads = 2,
        head_dim = 8,
        max_position_embeddings = 64,
    ),
    dims(b = 1..=2, n = 1..=6),
    args(input_ids = [b, n] ~ int(0..64)),
    decode(padding, generate = 6),
    cases = 8,
)]
#[allow(clippy::too_many_arguments)]
pub fn greedy_llama(
    vb: VarBuilder,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
) -> Result<impl FnMut(&Step) -> Result<BTreeMap<&'static str, Tensor>>> {
    cached_llama(
        vb,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
    )
}
