//! Cohere (`transformers.models.cohere`, Command-R's layout): one norm per layer feeding the
//! attention and the MLP in parallel; `CohereLayerNorm`, a layer norm without bias (the mean
//! subtracted) in float32; rotary embeddings on interleaved pairs (`repeat_interleave` of the
//! frequencies, `rotate_half` on even and odd dims); per-head norms of the queries and keys
//! (`use_qk_norm`, weights `[heads, head_dim]`); grouped key/value heads; the tied head's logits
//! times `logit_scale`.

use super::{
    angles, attend, cause, configured, decoded, decoding, heads, hidden_states, input_ids,
    layer_norm, port, rms_norm, rope, rotate, visible, Cache, Cause, Class, Groups, HeldOut, Kind,
    Lin, Pairs,
};
use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::Layer;
use std::collections::BTreeMap;

const VOCAB: usize = 64;
const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const INTERMEDIATE: usize = 64;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;
const THETA: f64 = 10_000.0;
/// Command-R's.
const LOGIT_SCALE: f64 = 0.0625;

/// The mistakes of a Cohere port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    RotaryHalves,
    QkNormAcrossHeads,
    NormWithoutMean,
    LogitScaleIgnored,
    CacheLengthWrongAxis,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.CohereConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("intermediate_size", INTERMEDIATE.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("num_key_value_heads", KV_HEADS.into()),
            ("max_position_embeddings", 64usize.into()),
            ("layer_norm_eps", EPS.into()),
            ("rope_parameters", rope(THETA, &[])),
            ("use_qk_norm", true.into()),
            ("logit_scale", LOGIT_SCALE.into()),
            ("tie_word_embeddings", true.into()),
            ("pad_token_id", 0usize.into()),
            ("bos_token_id", 1usize.into()),
            ("eos_token_id", 2usize.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    let class = |c: &str| format!("transformers.models.cohere.modeling_cohere.{c}");
    match kind {
        Kind::Attention => hidden_states(
            config(name, &class("CohereAttention")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Mlp => hidden_states(config(name, &class("CohereMLP")), HIDDEN),
        Kind::Layer => hidden_states(
            config(name, &class("CohereDecoderLayer")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Model => input_ids(config(name, "transformers.CohereForCausalLM"), VOCAB, 1, 8),
        Kind::Decode => decoded(
            config(name, "transformers.CohereForCausalLM"),
            VOCAB,
            6,
            None,
        ),
    }
}

fn check(
    kind: Kind,
    name: &'static str,
    m: Mistake,
    class: Option<Class>,
    causes: Vec<Cause>,
) -> HeldOut {
    let layer = layer(kind, &format!("h_{name}"));
    let port = match kind {
        Kind::Attention => port(move |i| {
            let out = Attention::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok((out,))
        }),
        Kind::Mlp => port(move |i| Mlp::new(&i.var_builder())?.forward(i.tensor(0))),
        Kind::Layer => port(move |i| Block::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)),
        Kind::Model => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
        Kind::Decode => decoding(move |vb| CausalLm::new(&vb, m), CausalLm::step),
    };
    HeldOut {
        family: "cohere",
        name,
        kind,
        mistake: class,
        causes,
        layer,
        port,
    }
}

/// The right port, through every kind of check its wrong ports go through.
pub fn right() -> Vec<HeldOut> {
    [
        (Kind::Attention, "cohere_right_attention"),
        (Kind::Layer, "cohere_right_layer"),
        (Kind::Model, "cohere_right_model"),
        (Kind::Decode, "cohere_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // Rotary embeddings on halves (Llama's `rotate_half`, copied with the rest of a Llama
        // port) where Cohere rotates interleaved pairs. Named: rotary on halves, at Cohere's
        // `rotate_half`, the interleaved frequencies or where they are applied.
        check(
            Kind::Attention,
            "cohere_rotary_halves",
            Mistake::RotaryHalves,
            Some(Class::Structure),
            ["halves", "rotate_half"]
                .into_iter()
                .flat_map(|words| {
                    [
                        "transformers/models/cohere/modeling_cohere.py:107",
                        "transformers/models/cohere/modeling_cohere.py:169",
                        "transformers/models/cohere/modeling_cohere.py:170",
                        "transformers/models/cohere/modeling_cohere.py:171",
                        "transformers/models/cohere/modeling_cohere.py:198",
                        "transformers/models/cohere/modeling_cohere.py:199",
                    ]
                    .map(|site| cause(words, site))
                })
                .collect(),
        ),
        // The query and key norms over each position's `heads · head_dim` values at once (the
        // weight is `[heads, head_dim]`, and OLMo 2 normalises so), where Cohere normalises each
        // head on its own. Named: the norm's mean and variance over other axes, at its lines or
        // its calls.
        check(
            Kind::Attention,
            "cohere_qk_norm_across_heads",
            Mistake::QkNormAcrossHeads,
            Some(Class::Structure),
            ["axis", "axes"]
                .into_iter()
                .flat_map(|words| {
                    [
                        "transformers/models/cohere/modeling_cohere.py:60",
                        "transformers/models/cohere/modeling_cohere.py:61",
                        "transformers/models/cohere/modeling_cohere.py:254",
                        "transformers/models/cohere/modeling_cohere.py:255",
                    ]
                    .map(|site| cause(words, site))
                })
                .collect(),
        ),
        // `CohereLayerNorm` (a norm without bias) ported as candle's `RmsNorm`: the mean never
        // subtracted, in every norm of the layer. Named: the subtraction of the mean left out.
        check(
            Kind::Layer,
            "cohere_norm_without_mean",
            Mistake::NormWithoutMean,
            Some(Class::Operation),
            vec![
                cause("sub", "transformers/models/cohere/modeling_cohere.py:61"),
                cause("sub", "transformers/models/cohere/modeling_cohere.py:62"),
                cause("- mean", "transformers/models/cohere/modeling_cohere.py:61"),
                cause("- mean", "transformers/models/cohere/modeling_cohere.py:62"),
            ],
        ),
        // The logits left unscaled: `logit_scale` (1/16) never read. Named: `logit_scale` where
        // the model reads it, or the product left out.
        check(
            Kind::Model,
            "cohere_logit_scale_ignored",
            Mistake::LogitScaleIgnored,
            Some(Class::Configuration),
            vec![
                cause(
                    "logit_scale",
                    "transformers/models/cohere/modeling_cohere.py:445",
                ),
                cause(
                    "logit_scale",
                    "transformers/models/cohere/modeling_cohere.py:495",
                ),
                cause(
                    "left out",
                    "transformers/models/cohere/modeling_cohere.py:495",
                ),
            ],
        ),
        // The rotary positions of a step offset by the cached keys' axis 1 — their key/value
        // heads (2) — instead of axis 2, their length (a port written for a `[b, t, heads, d]`
        // cache). Named: the cache's length read from another axis (a mistake of driving).
        check(
            Kind::Decode,
            "cohere_cache_length_wrong_axis",
            Mistake::CacheLengthWrongAxis,
            Some(Class::Driving),
            vec![cause("axis", "")],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

/// `CohereLayerNorm` over the last axis, no bias (as an RMS norm with the mistake).
fn norm(x: &Tensor, w: &Tensor, m: Mistake) -> Result<Tensor> {
    if m == Mistake::NormWithoutMean {
        rms_norm(x, w, EPS)
    } else {
        layer_norm(x, w, None, EPS)
    }
}

/// The per-head norm of `x` `[b, t, h, d]` with its weight `[h, d]`.
fn head_norm(x: &Tensor, w: &Tensor, m: Mistake) -> Result<Tensor> {
    if m == Mistake::QkNormAcrossHeads {
        let (b, t, h, d) = x.dims4()?;
        let flat = x.reshape((b, t, h * d))?;
        return norm(&flat, &w.flatten_all()?, m)?.reshape((b, t, h, d));
    }
    let centred = if m == Mistake::NormWithoutMean {
        x.clone()
    } else {
        x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?
    };
    let var = if m == Mistake::NormWithoutMean {
        x.sqr()?.mean_keepdim(D::Minus1)?
    } else {
        centred.sqr()?.mean_keepdim(D::Minus1)?
    };
    centred
        .broadcast_div(&(var + EPS)?.sqrt()?)?
        .broadcast_mul(w)
}

/// `CohereAttention`, with its cache.
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    q_norm: Tensor,
    k_norm: Tensor,
    m: Mistake,
    cache: Cache,
}

impl Attention {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            q: Lin::new(vb, "q_proj", HEADS * HEAD_DIM, HIDDEN, false)?,
            k: Lin::new(vb, "k_proj", KV_HEADS * HEAD_DIM, HIDDEN, false)?,
            v: Lin::new(vb, "v_proj", KV_HEADS * HEAD_DIM, HIDDEN, false)?,
            o: Lin::new(vb, "o_proj", HIDDEN, HEADS * HEAD_DIM, false)?,
            q_norm: vb.get((HEADS, HEAD_DIM), "q_norm.weight")?,
            k_norm: vb.get((KV_HEADS, HEAD_DIM), "k_norm.weight")?,
            m,
            cache: Cache::default(),
        })
    }

    /// The attention of `x` `[b, t, hidden]`, its tokens at positions `start..start + t` for
    /// the rotary embedding, after `past` cached positions.
    fn forward_at(&mut self, x: &Tensor, start: usize, past: usize) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let split = |y: Tensor, h: usize| y.reshape((b, t, h, HEAD_DIM));
        let q = head_norm(&split(self.q.forward(x)?, HEADS)?, &self.q_norm, self.m)?;
        let k = head_norm(&split(self.k.forward(x)?, KV_HEADS)?, &self.k_norm, self.m)?;
        let (q, k) = (
            q.transpose(1, 2)?.contiguous()?,
            k.transpose(1, 2)?.contiguous()?,
        );
        let v = heads(&self.v.forward(x)?, KV_HEADS, HEAD_DIM)?;
        let a = angles(start, t, HEAD_DIM, THETA, x.device())?;
        let pairs = if self.m == Mistake::RotaryHalves {
            Pairs::Halves
        } else {
            Pairs::Interleaved
        };
        let (q, k) = (rotate(&q, &a, pairs)?, rotate(&k, &a, pairs)?);
        let (k, v) = self.cache.append(k, v)?;
        let seen = visible(past, t, None, x.device())?;
        let y = attend(
            &q,
            &k,
            &v,
            1.0 / (HEAD_DIM as f64).sqrt(),
            Some(&seen),
            Groups::Consecutive,
        )?;
        self.o.forward(&y)
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        self.forward_at(x, past, past)
    }
}

/// `CohereMLP`: SwiGLU.
struct Mlp {
    gate: Lin,
    up: Lin,
    down: Lin,
}

impl Mlp {
    fn new(vb: &VarBuilder) -> Result<Mlp> {
        Ok(Mlp {
            gate: Lin::new(vb, "gate_proj", INTERMEDIATE, HIDDEN, false)?,
            up: Lin::new(vb, "up_proj", INTERMEDIATE, HIDDEN, false)?,
            down: Lin::new(vb, "down_proj", HIDDEN, INTERMEDIATE, false)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = (candle_nn::ops::silu(&self.gate.forward(x)?)? * self.up.forward(x)?)?;
        self.down.forward(&h)
    }
}

/// `CohereDecoderLayer`: `x + attn(ln(x)) + mlp(ln(x))`.
struct Block {
    norm: Tensor,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            norm: vb.get(HIDDEN, "input_layernorm.weight")?,
            attention: Attention::new(&vb.pp("self_attn"), m)?,
            mlp: Mlp::new(&vb.pp("mlp"))?,
            m,
        })
    }

    fn forward_at(&mut self, x: &Tensor, start: usize, past: usize) -> Result<Tensor> {
        let normed = norm(x, &self.norm, self.m)?;
        let attn = self.attention.forward_at(&normed, start, past)?;
        (attn + self.mlp.forward(&normed)?)? + x
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        self.forward_at(x, past, past)
    }
}

/// `CohereForCausalLM`, its head tied to the embeddings.
struct CausalLm {
    embed: Tensor,
    layers: Vec<Block>,
    norm: Tensor,
    m: Mistake,
}

impl CausalLm {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<CausalLm> {
        let model = vb.pp("model");
        Ok(CausalLm {
            embed: model.get((VOCAB, HIDDEN), "embed_tokens.weight")?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&model.pp("layers").pp(i), m))
                .collect::<Result<_>>()?,
            norm: model.get(HIDDEN, "norm.weight")?,
            m,
        })
    }

    fn forward(&mut self, ids: &Tensor, past: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        // Where the rotary positions of this call start: the cache's length, or (the mistake)
        // its axis 1.
        let start = match (self.m, self.layers[0].attention.cache.keys()) {
            (Mistake::CacheLengthWrongAxis, Some(k)) => k.dim(1)?,
            _ => past,
        };
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        for layer in &mut self.layers {
            h = layer.forward_at(&h, start, past)?;
        }
        let logits =
            Lin::from_weight(self.embed.clone()).forward(&norm(&h, &self.norm, self.m)?)?;
        if self.m == Mistake::LogitScaleIgnored {
            Ok(logits)
        } else {
            logits * LOGIT_SCALE
        }
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
