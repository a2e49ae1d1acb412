//! A tiny GPT-NeoX in candle, as a newcomer writes it from transformers' documentation of
//! `GPTNeoXForCausalLM` (no candle-transformers model to start from): the MLP, the attention with
//! its fused query/key/value projection and partial rotary embeddings, the parallel-residual layer,
//! the model and its head, with a KV cache for `decode(...)` and `golden::tap` at the points a
//! trace compares. [`Neox`] plants the mistakes of issue #30, one at a time, each realistic:
//!
//! 1. the fused projection split as `[q | k | v]` over the whole hidden size (Megatron's layout)
//!    where transformers views it per head as `[q_h | k_h | v_h]` and chunks that;
//! 2. rotary embeddings on the whole head, the `partial_rotary_factor` (0.25) ignored;
//! 3. rotary embeddings on interleaved pairs (candle's `rope_i`) instead of halves;
//! 4. the parallel residual computed sequentially (`use_parallel_residual` ignored);
//! 5. a causal mask one diagonal off (each query also sees the next key);
//! 6. attention scores scaled by 1/d instead of 1/√d;
//! 7. the tanh GELU (`Tensor::gelu`) for the erf one;
//! 8. LayerNorm eps 1e-6 instead of the config's 1e-5;
//! 9. rotary base 10000 (Pythia's) instead of the config's `rope_theta`;
//! 10. the heads merged back without their transpose (`[b, h, t, d]` reshaped to `[b, t, h·d]`).
//!
//! And the "wrong words" ports of the issue: a LayerNorm bias the port never reads.
//!
//! Every check is against the real `transformers` class built from one small `GPTNeoXConfig`:
//! `GPTNeoXMLP`, `GPTNeoXAttention` and `GPTNeoXLayer` given the `position_embeddings` and mask
//! that golden builds for a submodule as the model would (`golden_ref/schedule.py`), and
//! `GPTNeoXForCausalLM`, whose head the port reads as `embed_out.weight`, the name
//! `save_pretrained` and Pythia's checkpoints use (served by `rename`).

use candle_core::{Device, Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::{Decode, DimExpr, Dist, IntoOutputs, Layer, Outputs, PortInputs, Step, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const VOCAB: usize = 64;
pub const HIDDEN: usize = 32;
pub const HEADS: usize = 2;
/// 16, so that the rotary part (a quarter) is 4 dims: two pairs, where halves and interleaved
/// pairs differ (with 2 dims they are the same rotation).
pub const HEAD_DIM: usize = HIDDEN / HEADS;
pub const PARTIAL_ROTARY: f64 = 0.25;
/// The rotated dims of a head: `int(head_dim · partial_rotary_factor)`.
pub const ROTARY: usize = 4;
pub const INTERMEDIATE: usize = 64;
pub const LAYERS: usize = 2;
/// Not Pythia's 10000: a config that says another base.
pub const THETA: f64 = 1000.0;
pub const EPS: f64 = 1e-5;
pub const POSITIONS: usize = 64;
/// Weights of a trained model's scale rather than a fresh one's (0.02, where attention is almost
/// uniform and a mask or rotary mistake moves the outputs by ~1e-4).
pub const INIT_RANGE: f64 = 0.2;

/// The mistakes of a GPT-NeoX port (all false: the right port).
#[derive(Clone, Copy, Debug, Default)]
pub struct Neox {
    /// 1. The fused projection split as `[q | k | v]` over the hidden size, then into heads.
    pub qkv_split_other_order: bool,
    /// 2. Rotary embeddings on the whole head (`partial_rotary_factor` read as 1.0).
    pub rotary_whole_head: bool,
    /// 3. Rotary embeddings on interleaved pairs (candle's `rope_i`), not on halves.
    pub rotary_interleaved: bool,
    /// 4. `x + attn(ln1(x))`, then `h + mlp(ln2(h))`: sequential, not parallel.
    pub sequential_residual: bool,
    /// 5. The causal mask lets each query see the next key too (`j ≤ i + 1`).
    pub mask_one_diagonal_off: bool,
    /// 6. Scores scaled by 1/head_dim instead of 1/√head_dim.
    pub scale_one_over_d: bool,
    /// 7. `Tensor::gelu` (tanh) for the erf GELU (`hidden_act = "gelu"`).
    pub gelu_tanh: bool,
    /// 8. Every LayerNorm with eps 1e-6 instead of `layer_norm_eps` (1e-5).
    pub layer_norm_eps_1e6: bool,
    /// 9. The rotary base 10000 instead of the config's `rope_theta`.
    pub rope_theta_default: bool,
    /// 10. The attention's heads merged back without transposing `[b, h, t, d]` first.
    pub heads_merged_untransposed: bool,
    /// Wrong words: the layers' `input_layernorm.bias` never read (a LayerNorm without bias).
    pub input_norm_bias_unread: bool,
}

// --- the checks ----------------------------------------------------------------------------------

const MODELING: &str = "transformers.models.gpt_neox.modeling_gpt_neox";

/// The configuration every check is built from.
fn configured(name: &str, reference: &str) -> Layer {
    Layer::module(name, reference)
        .config("transformers.GPTNeoXConfig")
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", HIDDEN)
        .config_value("num_hidden_layers", LAYERS)
        .config_value("num_attention_heads", HEADS)
        .config_value("intermediate_size", INTERMEDIATE)
        .config_value("max_position_embeddings", POSITIONS)
        .config_value(
            "rope_parameters",
            Value::Dict(vec![
                ("rope_type".into(), Value::Str("default".into())),
                ("rope_theta".into(), Value::Float(THETA)),
                ("partial_rotary_factor".into(), Value::Float(PARTIAL_ROTARY)),
            ]),
        )
        .config_value("use_parallel_residual", true)
        .config_value("layer_norm_eps", EPS)
        .config_value("hidden_act", "gelu")
        .config_value("initializer_range", INIT_RANGE)
        .cases(12)
}

fn hidden_states(layer: Layer, name: &str) -> Layer {
    layer.dim("b", 1, 2).dim("t", 1, 8).arg(
        name,
        ["b".into(), "t".into(), DimExpr::Lit(HIDDEN)],
        Dist::default(),
    )
}

/// `GPTNeoXMLP` on its own.
pub fn mlp_layer(name: &str) -> Layer {
    hidden_states(
        configured(name, &format!("{MODELING}.GPTNeoXMLP")),
        "hidden_states",
    )
}

/// `GPTNeoXAttention` on its own, given the rotary tables and the causal mask a model builds.
/// Built with sdpa (what a config built on its own picks for GPT-NeoX), it returns
/// `(output, None)`: its one leaf is `out.0`.
pub fn attention_layer(name: &str) -> Layer {
    hidden_states(
        configured(name, &format!("{MODELING}.GPTNeoXAttention")).init("layer_idx", 0usize),
        "hidden_states",
    )
}

/// `GPTNeoXLayer` (the block) on its own, given what the model builds for it.
pub fn block_layer(name: &str) -> Layer {
    hidden_states(
        configured(name, &format!("{MODELING}.GPTNeoXLayer")).init("layer_idx", 0usize),
        "hidden_states",
    )
}

/// `GPTNeoXForCausalLM`: logits of every position (`out.logits`). The head is `lm_head.weight` in
/// the module and `embed_out.weight` in a saved checkpoint, which is what the port reads.
pub fn causal_lm_layer(name: &str) -> Layer {
    configured(name, "transformers.GPTNeoXForCausalLM")
        .rename("lm_head", "embed_out")
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg("input_ids", ["b", "t"], Dist::int(0, VOCAB as i64))
}

/// The causal LM with `trace`: the port taps every submodule it has, named like the reference's.
pub fn traced_layer(name: &str) -> Layer {
    causal_lm_layer(name).trace()
}

/// The causal LM driven through `decode(...)`: prefills, one-token steps and chunks on the cache.
pub fn decode_layer(name: &str) -> Layer {
    causal_lm_layer(name)
        .dim("t", 2, 8)
        .decode(Decode::over("input_ids"))
}

// --- the port ------------------------------------------------------------------------------------

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A Linear with its bias (`attention_bias` is true, and the MLP's have one).
struct Lin {
    w: Tensor,
    b: Tensor,
    name: String,
}

impl Lin {
    fn new(vb: &VarBuilder, out: usize, inp: usize, name: &str) -> Result<Lin> {
        let vb = vb.pp(name);
        Ok(Lin {
            w: vb.get((out, inp), "weight")?,
            b: vb.get(out, "bias")?,
            name: vb.prefix(),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.broadcast_matmul(&self.w.t()?)?.broadcast_add(&self.b)?;
        golden::tap(&self.name, &y);
        Ok(y)
    }
}

/// nn.LayerNorm written out (candle's fused `layer_norm` has no backward).
struct Norm {
    w: Tensor,
    b: Option<Tensor>,
    eps: f64,
    name: String,
}

impl Norm {
    fn new(vb: &VarBuilder, name: &str, o: Neox, with_bias: bool) -> Result<Norm> {
        let vb = vb.pp(name);
        Ok(Norm {
            w: vb.get(HIDDEN, "weight")?,
            b: if with_bias {
                Some(vb.get(HIDDEN, "bias")?)
            } else {
                None
            },
            eps: if o.layer_norm_eps_1e6 { 1e-6 } else { EPS },
            name: vb.prefix(),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let y = centred
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.w)?;
        let y = match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        golden::tap(&self.name, &y);
        Ok(y)
    }
}

/// `GPTNeoXMLP`: `dense_4h_to_h(act(dense_h_to_4h(x)))`.
struct Mlp {
    up: Lin,
    down: Lin,
    o: Neox,
    name: String,
}

impl Mlp {
    fn new(vb: &VarBuilder, o: Neox) -> Result<Mlp> {
        Ok(Mlp {
            up: Lin::new(vb, INTERMEDIATE, HIDDEN, "dense_h_to_4h")?,
            down: Lin::new(vb, HIDDEN, INTERMEDIATE, "dense_4h_to_h")?,
            o,
            name: vb.prefix(),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.up.forward(x)?;
        let h = if self.o.gelu_tanh {
            h.gelu()?
        } else {
            h.gelu_erf()?
        };
        golden::tap(join(&self.name, "act"), &h);
        let y = self.down.forward(&h)?;
        golden::tap(&self.name, &y);
        Ok(y)
    }
}

/// cos and sin of positions `past..past + t` over the rotated dims, `[t, rotary]`, computed in
/// float32 as `GPTNeoXRotaryEmbedding` computes them (the frequencies over both halves), then in
/// `dtype`.
fn rotary_tables(past: usize, t: usize, o: Neox, x: &Tensor) -> Result<(Tensor, Tensor)> {
    let dims = if o.rotary_whole_head {
        HEAD_DIM
    } else {
        ROTARY
    };
    let base = if o.rope_theta_default {
        10_000f32
    } else {
        THETA as f32
    };
    let inv_freq: Vec<f32> = (0..dims / 2)
        .map(|j| 1.0 / base.powf((2 * j) as f32 / dims as f32))
        .collect();
    let freqs: Vec<f32> = (past..past + t)
        .flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f))
        .collect();
    let freqs = Tensor::from_vec(freqs, (t, dims / 2), x.device())?;
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
    Ok((
        emb.cos()?.to_dtype(x.dtype())?,
        emb.sin()?.to_dtype(x.dtype())?,
    ))
}

/// The rotary embedding on the first `cos.dim(1)` dims of each head, the rest passed through.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, o: Neox) -> Result<Tensor> {
    let dims = cos.dim(1)?;
    let x_rot = x.narrow(D::Minus1, 0, dims)?;
    let rotated = if o.rotary_interleaved {
        // candle's rotary on interleaved pairs, with the table of each pair's frequency.
        let half = dims / 2;
        candle_nn::rotary_emb::rope_i(
            &x_rot.contiguous()?,
            &cos.narrow(1, 0, half)?.contiguous()?,
            &sin.narrow(1, 0, half)?.contiguous()?,
        )?
    } else {
        let x1 = x_rot.narrow(D::Minus1, 0, dims / 2)?;
        let x2 = x_rot.narrow(D::Minus1, dims / 2, dims / 2)?;
        let half_rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        (x_rot.broadcast_mul(cos)? + half_rotated.broadcast_mul(sin)?)?
    };
    if dims == HEAD_DIM {
        return Ok(rotated);
    }
    let x_pass = x.narrow(D::Minus1, dims, HEAD_DIM - dims)?;
    Tensor::cat(&[&rotated, &x_pass], D::Minus1)
}

/// Which keys each query may see: `[t, past + t]`, 1 allowed.
fn causal(past: usize, t: usize, o: Neox, device: &Device) -> Result<Tensor> {
    let ahead = usize::from(o.mask_one_diagonal_off);
    let values: Vec<u8> = (0..t)
        .flat_map(|i| (0..past + t).map(move |j| u8::from(j <= past + i + ahead)))
        .collect();
    Tensor::from_vec(values, (t, past + t), device)
}

/// `GPTNeoXAttention`, with its own cache of keys and values (for `decode`).
pub struct Attention {
    qkv: Lin,
    dense: Lin,
    cache: Option<(Tensor, Tensor)>,
    o: Neox,
    name: String,
}

impl Attention {
    pub fn new(vb: &VarBuilder, o: Neox) -> Result<Attention> {
        Ok(Attention {
            qkv: Lin::new(vb, 3 * HIDDEN, HIDDEN, "query_key_value")?,
            dense: Lin::new(vb, HIDDEN, HIDDEN, "dense")?,
            cache: None,
            o,
            name: vb.prefix(),
        })
    }

    /// The attention's output `[b, t, hidden]` and its probabilities `[b, heads, t, past + t]`.
    pub fn forward(&mut self, x: &Tensor, past: usize) -> Result<(Tensor, Tensor)> {
        let o = self.o;
        let (b, t, _) = x.dims3()?;
        let fused = self.qkv.forward(x)?;
        let part = |i: usize| -> Result<Tensor> {
            if o.qkv_split_other_order {
                fused
                    .narrow(D::Minus1, i * HIDDEN, HIDDEN)?
                    .reshape((b, t, HEADS, HEAD_DIM))?
                    .transpose(1, 2)?
                    .contiguous()
            } else {
                fused
                    .reshape((b, t, HEADS, 3 * HEAD_DIM))?
                    .transpose(1, 2)?
                    .narrow(D::Minus1, i * HEAD_DIM, HEAD_DIM)?
                    .contiguous()
            }
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let (cos, sin) = rotary_tables(past, t, o, x)?;
        let (q, k) = (rotate(&q, &cos, &sin, o)?, rotate(&k, &cos, &sin, o)?);
        let (k, v) = match self.cache.take() {
            Some((k0, v0)) => (Tensor::cat(&[&k0, &k], 2)?, Tensor::cat(&[&v0, &v], 2)?),
            None => (k, v),
        };
        self.cache = Some((k.clone(), v.clone()));
        let scale = if o.scale_one_over_d {
            1.0 / HEAD_DIM as f64
        } else {
            (HEAD_DIM as f64).powf(-0.5)
        };
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let floor = Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?
            .to_dtype(scores.dtype())?;
        let scores = causal(past, t, o, x.device())?
            .broadcast_as(scores.shape())?
            .where_cond(&scores, &floor)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = probs.matmul(&v)?;
        let y = if o.heads_merged_untransposed {
            y.reshape((b, t, HIDDEN))?
        } else {
            y.transpose(1, 2)?.reshape((b, t, HIDDEN))?
        };
        let out = self.dense.forward(&y)?;
        golden::tap(join(&self.name, "0"), &out);
        Ok((out, probs))
    }
}

/// `GPTNeoXLayer`: pre-norm attention and MLP, in parallel on the same input.
pub struct Block {
    input_norm: Norm,
    post_norm: Norm,
    attention: Attention,
    mlp: Mlp,
    o: Neox,
    name: String,
}

impl Block {
    pub fn new(vb: &VarBuilder, o: Neox) -> Result<Block> {
        Ok(Block {
            input_norm: Norm::new(vb, "input_layernorm", o, !o.input_norm_bias_unread)?,
            post_norm: Norm::new(vb, "post_attention_layernorm", o, true)?,
            attention: Attention::new(&vb.pp("attention"), o)?,
            mlp: Mlp::new(&vb.pp("mlp"), o)?,
            o,
            name: vb.prefix(),
        })
    }

    pub fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let (attn, _) = self.attention.forward(&self.input_norm.forward(x)?, past)?;
        let out = if self.o.sequential_residual {
            let h = (attn + x)?;
            let mlp = self.mlp.forward(&self.post_norm.forward(&h)?)?;
            (mlp + h)?
        } else {
            let mlp = self.mlp.forward(&self.post_norm.forward(x)?)?;
            ((mlp + attn)? + x)?
        };
        golden::tap(&self.name, &out);
        Ok(out)
    }
}

/// `GPTNeoXForCausalLM` with its cache: one call per step, the logits of every position.
pub struct CausalLm {
    embed: Tensor,
    layers: Vec<Block>,
    final_norm: Norm,
    head: Tensor,
    o: Neox,
}

impl CausalLm {
    pub fn new(vb: &VarBuilder, o: Neox) -> Result<CausalLm> {
        let m = vb.pp("gpt_neox");
        Ok(CausalLm {
            embed: m.get((VOCAB, HIDDEN), "embed_in.weight")?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&m.pp("layers").pp(i), o))
                .collect::<Result<_>>()?,
            final_norm: Norm::new(&m, "final_layer_norm", o, true)?,
            // `save_pretrained`'s (and Pythia's) name for the head.
            head: vb.get((VOCAB, HIDDEN), "embed_out.weight")?,
            o,
        })
    }

    /// The logits `[b, t, vocab]` of `ids` `[b, t]`, after `past` cached positions.
    pub fn forward(&mut self, ids: &Tensor, past: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        golden::tap("gpt_neox.embed_in", &h);
        // `GPTNeoXRotaryEmbedding`'s cos and sin, `[1, t, rotary]` (each attention computes its own).
        let (cos, sin) = rotary_tables(past, t, self.o, &h)?;
        golden::tap("gpt_neox.rotary_emb.0", &cos.unsqueeze(0)?);
        golden::tap("gpt_neox.rotary_emb.1", &sin.unsqueeze(0)?);
        for layer in &mut self.layers {
            h = layer.forward(&h, past)?;
        }
        let h = self.final_norm.forward(&h)?;
        let logits = h.broadcast_matmul(&self.head.t()?)?;
        golden::tap("lm_head", &logits);
        Ok(logits)
    }

    pub fn step(&mut self, step: &Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}

// --- ports as the checks call them ---------------------------------------------------------------

/// A port as a check calls it.
pub type Port = Arc<dyn Fn(&PortInputs) -> std::result::Result<Outputs, String> + Send + Sync>;

fn port<O: IntoOutputs>(f: impl Fn(&PortInputs) -> Result<O> + Send + Sync + 'static) -> Port {
    Arc::new(move |i| f(i).into_outputs())
}

/// The port of [`mlp_layer`].
pub fn mlp(o: Neox) -> Port {
    port(move |i| Mlp::new(&i.var_builder(), o)?.forward(i.tensor(0)))
}

/// The port of [`attention_layer`]: `(out,)`, the reference's `(out, None)`.
pub fn attention(o: Neox) -> Port {
    port(move |i| {
        let (out, _) = Attention::new(&i.var_builder(), o)?.forward(i.tensor(0), 0)?;
        Ok((out,))
    })
}

/// A port of [`attention_layer`] that returns its attention probabilities too, where the
/// reference returns `None` in their place.
pub fn attention_with_probabilities() -> Port {
    port(move |i| Attention::new(&i.var_builder(), Neox::default())?.forward(i.tensor(0), 0))
}

/// The port of [`block_layer`].
pub fn block(o: Neox) -> Port {
    port(move |i| Block::new(&i.var_builder(), o)?.forward(i.tensor(0), 0))
}

/// The port of [`block_layer`] for gradient and training checks: the same function, as a plain
/// closure (what `must_fail_check` takes).
pub fn block_fn(o: Neox) -> impl Fn(&PortInputs) -> Result<Tensor> + Clone + Send + Sync + 'static {
    move |i: &PortInputs| Block::new(&i.var_builder(), o)?.forward(i.tensor(0), 0)
}

/// The port of [`causal_lm_layer`] and [`traced_layer`]: `{"logits": …}`.
pub fn causal_lm(o: Neox) -> Port {
    port(move |i| {
        let logits = CausalLm::new(&i.var_builder(), o)?.forward(i.tensor(0), 0)?;
        Ok(BTreeMap::from([("logits", logits)]))
    })
}

/// A port of [`causal_lm_layer`] that returns the bare logits tensor where the reference returns
/// a `CausalLMOutputWithPast` (leaf `logits`).
pub fn causal_lm_bare_tensor() -> Port {
    port(move |i| CausalLm::new(&i.var_builder(), Neox::default())?.forward(i.tensor(0), 0))
}

/// The port of [`decode_layer`]: the model built once per case, one call per step.
pub fn decode(o: Neox) -> Port {
    Arc::new(crate::common::stepping(
        "logits",
        move |vb| CausalLm::new(&vb, o),
        CausalLm::step,
    ))
}
