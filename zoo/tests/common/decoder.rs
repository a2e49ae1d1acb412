//! A candle port of a small Llama-style causal language model *with a KV cache*, written as a
//! porter of `LlamaForCausalLM` or `MistralForCausalLM` would, driven through golden's schedules
//! (`decode(...)`): the checks of `tests/schedules.rs`. Each step gets its chunk of `input_ids`,
//! the number of cached positions, the position ids and (padded batches) the attention mask; the
//! cache lives in the stepper. [`Bugs`] plants the porting bugs that only show through time.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::{Decode, DimExpr, Dist, Layer, Step};

pub const VOCAB: usize = 32;
pub const HIDDEN: usize = 16;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 4;
pub const INTERMEDIATE: usize = 24;
pub const LAYERS: usize = 2;
pub const THETA: f32 = 10_000.0;
pub const EPS: f64 = 1e-6;

/// Bugs that a single forward never shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bugs {
    /// Rotary positions start at 0 in every call instead of at the cache's length.
    pub rope_not_offset: bool,
    /// The new keys and values are appended to the cache along the heads axis.
    pub cache_on_heads_axis: bool,
    /// The causal mask is `t × t`, as if the cache were empty, in every call of several tokens.
    pub square_mask: bool,
    /// The sliding window keeps `w + 1` keys (`j >= i - w`), one more than transformers.
    pub window_wider: bool,
    /// Position ids are `offset..offset + t` in a padded batch too, not counted over valid tokens.
    pub positions_ignore_padding: bool,
    /// Padded keys are attended to (only the causal mask is applied).
    pub pad_keys_unmasked: bool,
}

/// The check of a whole causal LM through schedules: `reference` is `LlamaForCausalLM` or
/// `MistralForCausalLM` (`window` is then its `sliding_window`).
pub fn causal_lm(name: &str, reference: &str, window: Option<usize>) -> Layer {
    let config = if reference.contains("Mistral") {
        "transformers.MistralConfig"
    } else {
        "transformers.LlamaConfig"
    };
    let mut layer = Layer::module(name, reference)
        .config(config)
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", HIDDEN)
        .config_value("intermediate_size", INTERMEDIATE)
        .config_value("num_hidden_layers", LAYERS)
        .config_value("num_attention_heads", HEADS)
        .config_value("num_key_value_heads", KV_HEADS)
        .config_value("head_dim", HEAD_DIM)
        .config_value("max_position_embeddings", 64usize)
        .config_value("rms_norm_eps", EPS);
    if let Some(w) = window {
        layer = layer.config_value("sliding_window", w);
    }
    layer
        .dim("b", 1, 3)
        .dim("n", 2, 10)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("n")],
            Dist::int(0, VOCAB as i64),
        )
        .decode(Decode::over("input_ids"))
        .cases(12)
}

/// The model's weights.
struct Weights {
    embed: Tensor,
    layers: Vec<LayerWeights>,
    norm: Tensor,
    lm_head: Tensor,
}

struct LayerWeights {
    input_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    post_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

fn load(vb: &VarBuilder) -> Result<Weights> {
    let m = vb.pp("model");
    let layers = (0..LAYERS)
        .map(|i| {
            let l = m.pp("layers").pp(i);
            let a = l.pp("self_attn");
            let mlp = l.pp("mlp");
            Ok(LayerWeights {
                input_norm: l.get(HIDDEN, "input_layernorm.weight")?,
                q: a.get((HEADS * HEAD_DIM, HIDDEN), "q_proj.weight")?,
                k: a.get((KV_HEADS * HEAD_DIM, HIDDEN), "k_proj.weight")?,
                v: a.get((KV_HEADS * HEAD_DIM, HIDDEN), "v_proj.weight")?,
                o: a.get((HIDDEN, HEADS * HEAD_DIM), "o_proj.weight")?,
                post_norm: l.get(HIDDEN, "post_attention_layernorm.weight")?,
                gate: mlp.get((INTERMEDIATE, HIDDEN), "gate_proj.weight")?,
                up: mlp.get((INTERMEDIATE, HIDDEN), "up_proj.weight")?,
                down: mlp.get((HIDDEN, INTERMEDIATE), "down_proj.weight")?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Weights {
        embed: m.get((VOCAB, HIDDEN), "embed_tokens.weight")?,
        layers,
        norm: m.get(HIDDEN, "norm.weight")?,
        lm_head: vb.get((VOCAB, HIDDEN), "lm_head.weight")?,
    })
}

fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.broadcast_matmul(&w.t()?)
}

fn rms_norm(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let h = x.to_dtype(DType::F32)?;
    let variance = h.sqr()?.mean_keepdim(D::Minus1)?;
    h.broadcast_div(&(variance + EPS)?.sqrt()?)?
        .to_dtype(dtype)?
        .broadcast_mul(w)
}

/// cos and sin `[b, 1, t, head_dim]` of the positions `[b, t]`, in float32 as
/// `LlamaRotaryEmbedding`, then in `dtype`.
fn rope_tables(positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|i| 1.0 / THETA.powf((2 * i) as f32 / HEAD_DIM as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, 1, HEAD_DIM / 2), positions.device())?;
    let freqs = positions
        .to_dtype(DType::F32)?
        .unsqueeze(2)?
        .broadcast_mul(&inv)?;
    let emb = Tensor::cat(&[&freqs, &freqs], 2)?.unsqueeze(1)?;
    Ok((emb.cos()?.to_dtype(dtype)?, emb.sin()?.to_dtype(dtype)?))
}

fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = HEAD_DIM / 2;
    let (x1, x2) = (x.narrow(3, 0, half)?, x.narrow(3, half, half)?);
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 3)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// Which keys each query may see, `[b, 1, t, past + t]` u8.
pub fn allowed(
    step: &Step,
    past: usize,
    t: usize,
    batch: usize,
    window: Option<usize>,
    bugs: Bugs,
) -> Result<Tensor> {
    let pads: Option<Vec<Vec<u8>>> = match step.attention_mask() {
        Some(m) if !bugs.pad_keys_unmasked => Some(m.to_vec2::<u8>()?),
        _ => None,
    };
    let keys = if bugs.square_mask && t > 1 {
        t
    } else {
        past + t
    };
    let mut values = Vec::with_capacity(batch * t * keys);
    for b in 0..batch {
        for i in 0..t {
            let at = if bugs.square_mask && t > 1 {
                i
            } else {
                past + i
            };
            for j in 0..keys {
                let mut ok = j <= at;
                if let Some(w) = window {
                    ok &= if bugs.window_wider {
                        j + w >= at
                    } else {
                        j + w > at
                    };
                }
                if let Some(p) = &pads {
                    ok &= p[b][j] == 1;
                }
                values.push(ok as u8);
            }
        }
    }
    Tensor::from_vec(values, (batch, 1, t, keys), &Device::Cpu)
}

/// The model with its cache: one call per step.
pub struct Model {
    w: Weights,
    cache: Vec<Option<(Tensor, Tensor)>>,
    window: Option<usize>,
    bugs: Bugs,
}

impl Model {
    pub fn new(vb: VarBuilder, window: Option<usize>, bugs: Bugs) -> Result<Model> {
        Ok(Model {
            w: load(&vb)?,
            cache: vec![None; LAYERS],
            window,
            bugs,
        })
    }

    /// The logits of this step's tokens, `[b, t, vocab]`.
    pub fn step(&mut self, step: &Step) -> Result<Tensor> {
        let ids = step.input("input_ids")?;
        let (batch, t) = ids.dims2()?;
        let past = step.offset();
        let positions = if self.bugs.rope_not_offset {
            Tensor::arange(0u32, t as u32, ids.device())?
                .unsqueeze(0)?
                .broadcast_as((batch, t))?
                .contiguous()?
        } else if self.bugs.positions_ignore_padding {
            Tensor::arange(past as u32, (past + t) as u32, ids.device())?
                .unsqueeze(0)?
                .broadcast_as((batch, t))?
                .contiguous()?
        } else {
            step.positions().clone()
        };
        let mut h = self
            .w
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((batch, t, HIDDEN))?;
        let (cos, sin) = rope_tables(&positions, h.dtype())?;
        let mask = allowed(step, past, t, batch, self.window, self.bugs)?;
        for (i, l) in self.w.layers.iter().enumerate() {
            let x = rms_norm(&h, &l.input_norm)?;
            let heads = |y: Tensor, n: usize| -> Result<Tensor> {
                y.reshape((batch, t, n, HEAD_DIM))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = rotate(&heads(linear(&x, &l.q)?, HEADS)?, &cos, &sin)?;
            let k = rotate(&heads(linear(&x, &l.k)?, KV_HEADS)?, &cos, &sin)?;
            let v = heads(linear(&x, &l.v)?, KV_HEADS)?;
            let axis = if self.bugs.cache_on_heads_axis { 1 } else { 2 };
            let (k, v) = match self.cache[i].take() {
                Some((k0, v0)) => (
                    Tensor::cat(&[&k0, &k], axis)?,
                    Tensor::cat(&[&v0, &v], axis)?,
                ),
                None => (k, v),
            };
            self.cache[i] = Some((k.clone(), v.clone()));
            let keys = k.dim(2)?;
            let repeat = |x: &Tensor| -> Result<Tensor> {
                let kv = x.dim(1)?;
                x.unsqueeze(2)?
                    .expand((batch, kv, HEADS / KV_HEADS, keys, HEAD_DIM))?
                    .reshape((batch, kv * HEADS / KV_HEADS, keys, HEAD_DIM))
            };
            let (k, v) = (repeat(&k)?, repeat(&v)?);
            let scores = (q.matmul(&k.t()?)? * (HEAD_DIM as f64).powf(-0.5))?;
            let floor = Tensor::full(f32::MIN, scores.shape(), scores.device())?
                .to_dtype(scores.dtype())?;
            let scores = mask
                .broadcast_as(scores.shape())?
                .where_cond(&scores, &floor)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = probs
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((batch, t, HEADS * HEAD_DIM))?;
            h = (h + linear(&out, &l.o)?)?;
            let x = rms_norm(&h, &l.post_norm)?;
            let mlp = linear(
                &(candle_nn::ops::silu(&linear(&x, &l.gate)?)? * linear(&x, &l.up)?)?,
                &l.down,
            )?;
            h = (h + mlp)?;
        }
        linear(&rms_norm(&h, &self.w.norm)?, &self.w.lm_head)
    }
}

/// The port of a check of [`causal_lm`]: builds the model, then one call per step, the logits as
/// the model's `logits`.
pub fn port(
    window: Option<usize>,
    bugs: Bugs,
) -> impl Fn(&golden::PortInputs) -> std::result::Result<golden::Outputs, String>
       + Clone
       + Send
       + Sync
       + 'static {
    crate::common::stepping(
        "logits",
        move |vb| Model::new(vb, window, bugs),
        Model::step,
    )
}

/// transformers' `LlamaAttention` on its own: the submodule check, whose reference takes the
/// `position_embeddings` and the mask its model builds (golden builds them from the config).
pub fn llama_attention(name: &str) -> Layer {
    Layer::module(
        name,
        "transformers.models.llama.modeling_llama.LlamaAttention",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", HIDDEN)
    .config_value("num_attention_heads", HEADS)
    .config_value("num_key_value_heads", KV_HEADS)
    .config_value("head_dim", HEAD_DIM)
    .config_value("max_position_embeddings", 64usize)
    .init("layer_idx", 0usize)
    .dim("b", 1, 2)
    .dim("n", 2, 8)
    .arg(
        "x",
        [DimExpr::from("b"), DimExpr::from("n"), DimExpr::Lit(HIDDEN)],
        Dist::default(),
    )
    .cases(12)
}

/// A port of `LlamaAttention` that keeps its own keys and values between calls.
pub struct Attention {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    cache: Option<(Tensor, Tensor)>,
    bugs: Bugs,
}

impl Attention {
    pub fn new(vb: &VarBuilder, bugs: Bugs) -> Result<Attention> {
        Ok(Attention {
            q: vb.get((HEADS * HEAD_DIM, HIDDEN), "q_proj.weight")?,
            k: vb.get((KV_HEADS * HEAD_DIM, HIDDEN), "k_proj.weight")?,
            v: vb.get((KV_HEADS * HEAD_DIM, HIDDEN), "v_proj.weight")?,
            o: vb.get((HIDDEN, HEADS * HEAD_DIM), "o_proj.weight")?,
            cache: None,
            bugs,
        })
    }

    /// The attention's output `[b, t, hidden]` for this step's hidden states.
    pub fn step(&mut self, step: &Step) -> Result<Tensor> {
        let x = step.tensor(0);
        let (batch, t, _) = x.dims3()?;
        let past = step.offset();
        let positions = if self.bugs.rope_not_offset {
            Tensor::arange(0u32, t as u32, x.device())?
                .unsqueeze(0)?
                .broadcast_as((batch, t))?
                .contiguous()?
        } else {
            step.positions().clone()
        };
        let (cos, sin) = rope_tables(&positions, x.dtype())?;
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            y.reshape((batch, t, n, HEAD_DIM))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rotate(&heads(linear(x, &self.q)?, HEADS)?, &cos, &sin)?;
        let k = rotate(&heads(linear(x, &self.k)?, KV_HEADS)?, &cos, &sin)?;
        let v = heads(linear(x, &self.v)?, KV_HEADS)?;
        let (k, v) = match self.cache.take() {
            Some((k0, v0)) => (Tensor::cat(&[&k0, &k], 2)?, Tensor::cat(&[&v0, &v], 2)?),
            None => (k, v),
        };
        self.cache = Some((k.clone(), v.clone()));
        let keys = k.dim(2)?;
        let repeat = |x: &Tensor| -> Result<Tensor> {
            x.unsqueeze(2)?
                .expand((batch, KV_HEADS, HEADS / KV_HEADS, keys, HEAD_DIM))?
                .reshape((batch, HEADS, keys, HEAD_DIM))
        };
        let scores = (q.matmul(&repeat(&k)?.t()?)? * (HEAD_DIM as f64).powf(-0.5))?;
        let mask = allowed(step, past, t, batch, None, self.bugs)?;
        let floor = Tensor::full(f32::MIN, scores.shape(), scores.device())?;
        let scores = mask
            .broadcast_as(scores.shape())?
            .where_cond(&scores, &floor)?;
        let out = candle_nn::ops::softmax_last_dim(&scores)?
            .matmul(&repeat(&v)?)?
            .transpose(1, 2)?
            .reshape((batch, t, HEADS * HEAD_DIM))?;
        linear(&out, &self.o)
    }
}

/// The port of [`llama_attention`]'s checks: its output as the module's first (`out.0`); with
/// `decode`, one call per step.
pub fn attention_port(
    bugs: Bugs,
) -> impl Fn(&golden::PortInputs) -> std::result::Result<golden::Outputs, String>
       + Clone
       + Send
       + Sync
       + 'static {
    crate::common::stepping("0", move |vb| Attention::new(&vb, bugs), Attention::step)
}
