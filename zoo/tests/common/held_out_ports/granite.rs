//! Granite (`transformers.models.granite`, IBM's Granite 3): Llama's layout with four scalars of
//! its configuration — the embeddings times `embedding_multiplier`, each residual branch times
//! `residual_multiplier`, the attention scores times `attention_multiplier` (in place of 1/√d),
//! the logits divided by `logits_scaling` — with grouped key/value heads and tied embeddings.
//! candle-transformers 0.11.1's `granite` reads none of the four: three of the mistakes below are
//! its.

use super::{
    angles, attend, cause, configured, decoded, decoding, heads, hidden_states, input_ids, port,
    rms_norm, rope, rotate, visible, Cache, Cause, Class, Groups, HeldOut, Kind, Lin, Pairs,
};
use candle_core::{Result, Tensor};
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
const EPS: f64 = 1e-6;
const THETA: f64 = 10_000.0;
/// Granite 3's values (its 2B model's): 1/head_dim for the scores.
const EMBEDDING_MULTIPLIER: f64 = 12.0;
const RESIDUAL_MULTIPLIER: f64 = 0.22;
const ATTENTION_MULTIPLIER: f64 = 0.125;
const LOGITS_SCALING: f64 = 8.0;

/// The mistakes of a Granite port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    AttentionMultiplierIgnored,
    ResidualMultiplierIgnored,
    EmbeddingMultiplierIgnored,
    LogitsScalingMultiplied,
    MaskOnlyWithoutCache,
    GateUpSwapped,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.GraniteConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("intermediate_size", INTERMEDIATE.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("num_key_value_heads", KV_HEADS.into()),
            ("max_position_embeddings", 64usize.into()),
            ("rms_norm_eps", EPS.into()),
            ("rope_parameters", rope(THETA, &[])),
            ("embedding_multiplier", EMBEDDING_MULTIPLIER.into()),
            ("residual_multiplier", RESIDUAL_MULTIPLIER.into()),
            ("attention_multiplier", ATTENTION_MULTIPLIER.into()),
            ("logits_scaling", LOGITS_SCALING.into()),
            ("tie_word_embeddings", true.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    let class = |c: &str| format!("transformers.models.granite.modeling_granite.{c}");
    match kind {
        Kind::Attention => hidden_states(
            config(name, &class("GraniteAttention")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Mlp => hidden_states(config(name, &class("GraniteMLP")), HIDDEN),
        Kind::Layer => hidden_states(
            config(name, &class("GraniteDecoderLayer")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Model => input_ids(config(name, "transformers.GraniteForCausalLM"), VOCAB, 1, 8),
        Kind::Decode => decoded(
            config(name, "transformers.GraniteForCausalLM"),
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
        Kind::Mlp => port(move |i| Mlp::new(&i.var_builder(), m)?.forward(i.tensor(0))),
        Kind::Layer => port(move |i| Block::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)),
        Kind::Model => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
        Kind::Decode => decoding(move |vb| CausalLm::new(&vb, m), CausalLm::step),
    };
    HeldOut {
        family: "granite",
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
        (Kind::Attention, "granite_right_attention"),
        (Kind::Mlp, "granite_right_mlp"),
        (Kind::Layer, "granite_right_layer"),
        (Kind::Model, "granite_right_model"),
        (Kind::Decode, "granite_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // The scores scaled by 1/√head_dim, as every Llama-like attention (and
        // candle-transformers' Granite) does, where Granite scales them by
        // `attention_multiplier`. Named: `attention_multiplier` where the attention reads it,
        // or the kernel's scale.
        check(
            Kind::Attention,
            "granite_attention_multiplier_ignored",
            Mistake::AttentionMultiplierIgnored,
            Some(Class::Configuration),
            vec![
                cause(
                    "attention_multiplier",
                    "transformers/models/granite/modeling_granite.py:123",
                ),
                cause("scale", "transformers/integrations/sdpa_attention.py:193"),
            ],
        ),
        // Each residual branch added as it is (candle-transformers' Granite), not times
        // `residual_multiplier`. Named: `residual_multiplier` where the layer reads it, or the
        // product left out at the two residual adds.
        check(
            Kind::Layer,
            "granite_residual_multiplier_ignored",
            Mistake::ResidualMultiplierIgnored,
            Some(Class::Configuration),
            vec![
                cause(
                    "residual_multiplier",
                    "transformers/models/granite/modeling_granite.py:227",
                ),
                cause(
                    "residual_multiplier",
                    "transformers/models/granite/modeling_granite.py:272",
                ),
                cause(
                    "residual_multiplier",
                    "transformers/models/granite/modeling_granite.py:277",
                ),
                cause(
                    "left out",
                    "transformers/models/granite/modeling_granite.py:272",
                ),
                cause(
                    "left out",
                    "transformers/models/granite/modeling_granite.py:277",
                ),
            ],
        ),
        // The embeddings used as they are (candle-transformers' Granite), not times
        // `embedding_multiplier`. Named: `embedding_multiplier` where the model reads it, or the
        // product left out.
        check(
            Kind::Model,
            "granite_embedding_multiplier_ignored",
            Mistake::EmbeddingMultiplierIgnored,
            Some(Class::Configuration),
            vec![
                cause(
                    "embedding_multiplier",
                    "transformers/models/granite/modeling_granite.py:362",
                ),
                cause(
                    "embedding_multiplier",
                    "transformers/models/granite/modeling_granite.py:386",
                ),
                cause(
                    "left out",
                    "transformers/models/granite/modeling_granite.py:386",
                ),
            ],
        ),
        // The logits multiplied by `logits_scaling`, as Cohere's by its `logit_scale`, where
        // Granite divides them. Named at the division: `logits_scaling`, or the division turned
        // into a product.
        check(
            Kind::Model,
            "granite_logits_scaling_multiplied",
            Mistake::LogitsScalingMultiplied,
            Some(Class::Configuration),
            vec![
                cause(
                    "logits_scaling",
                    "transformers/models/granite/modeling_granite.py:486",
                ),
                cause("div", "transformers/models/granite/modeling_granite.py:486"),
                cause("mul", "transformers/models/granite/modeling_granite.py:486"),
            ],
        ),
        // The causal mask built on the first call only (`if seqlen_offset == 0`), as for a
        // decode that goes one token at a time: a chunk of several tokens on a non-empty cache
        // then sees the later tokens of its chunk. Named: the causal mask left out, where the
        // model builds it or where the kernel applies it.
        check(
            Kind::Decode,
            "granite_mask_only_without_cache",
            Mistake::MaskOnlyWithoutCache,
            Some(Class::Structure),
            vec![
                cause(
                    "mask",
                    "transformers/models/granite/modeling_granite.py:396",
                ),
                cause("mask", "transformers/integrations/sdpa_attention.py:193"),
                cause("causal", "transformers/integrations/sdpa_attention.py:193"),
                cause("causal", "transformers/integrations/sdpa_attention.py:159"),
                cause("mask", "transformers/masking_utils.py:76"),
            ],
        ),
        // SiLU on the up projection and the gate as the multiplier (`gate_proj` and `up_proj`
        // read in each other's place, as a fused `gate_up_proj` split in the other order).
        // Named: the two projections exchanged in the MLP's line.
        check(
            Kind::Mlp,
            "granite_gate_up_swapped",
            Mistake::GateUpSwapped,
            Some(Class::Structure),
            vec![
                cause(
                    "swapped",
                    "transformers/models/granite/modeling_granite.py:214",
                ),
                cause(
                    "other order",
                    "transformers/models/granite/modeling_granite.py:214",
                ),
                cause(
                    "up_proj",
                    "transformers/models/granite/modeling_granite.py:214",
                ),
            ],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

/// `GraniteAttention`, with its cache.
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
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
            m,
            cache: Cache::default(),
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let q = heads(&self.q.forward(x)?, HEADS, HEAD_DIM)?;
        let k = heads(&self.k.forward(x)?, KV_HEADS, HEAD_DIM)?;
        let v = heads(&self.v.forward(x)?, KV_HEADS, HEAD_DIM)?;
        let a = angles(past, t, HEAD_DIM, THETA, x.device())?;
        let (q, k) = (
            rotate(&q, &a, Pairs::Halves)?,
            rotate(&k, &a, Pairs::Halves)?,
        );
        let (k, v) = self.cache.append(k, v)?;
        let seen = if self.m == Mistake::MaskOnlyWithoutCache && past > 0 {
            None
        } else {
            Some(visible(past, t, None, x.device())?)
        };
        let scale = if self.m == Mistake::AttentionMultiplierIgnored {
            1.0 / (HEAD_DIM as f64).sqrt()
        } else {
            ATTENTION_MULTIPLIER
        };
        let y = attend(&q, &k, &v, scale, seen.as_ref(), Groups::Consecutive)?;
        self.o.forward(&y)
    }
}

/// `GraniteMLP`: SwiGLU.
struct Mlp {
    gate: Lin,
    up: Lin,
    down: Lin,
}

impl Mlp {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Mlp> {
        let (gate, up) = if m == Mistake::GateUpSwapped {
            ("up_proj", "gate_proj")
        } else {
            ("gate_proj", "up_proj")
        };
        Ok(Mlp {
            gate: Lin::new(vb, gate, INTERMEDIATE, HIDDEN, false)?,
            up: Lin::new(vb, up, INTERMEDIATE, HIDDEN, false)?,
            down: Lin::new(vb, "down_proj", HIDDEN, INTERMEDIATE, false)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = (candle_nn::ops::silu(&self.gate.forward(x)?)? * self.up.forward(x)?)?;
        self.down.forward(&h)
    }
}

/// `GraniteDecoderLayer`: pre-norm attention and MLP, each branch times the residual multiplier.
struct Block {
    input_norm: Tensor,
    post_norm: Tensor,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            input_norm: vb.get(HIDDEN, "input_layernorm.weight")?,
            post_norm: vb.get(HIDDEN, "post_attention_layernorm.weight")?,
            attention: Attention::new(&vb.pp("self_attn"), m)?,
            mlp: Mlp::new(&vb.pp("mlp"), m)?,
            m,
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let branch = |y: Tensor| -> Result<Tensor> {
            if self.m == Mistake::ResidualMultiplierIgnored {
                Ok(y)
            } else {
                y * RESIDUAL_MULTIPLIER
            }
        };
        let attn = self
            .attention
            .forward(&rms_norm(x, &self.input_norm, EPS)?, past)?;
        let h = (x + branch(attn)?)?;
        let mlp = self.mlp.forward(&rms_norm(&h, &self.post_norm, EPS)?)?;
        &h + branch(mlp)?
    }
}

/// `GraniteForCausalLM`, its head tied to the embeddings.
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
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        if self.m != Mistake::EmbeddingMultiplierIgnored {
            h = (h * EMBEDDING_MULTIPLIER)?;
        }
        for layer in &mut self.layers {
            h = layer.forward(&h, past)?;
        }
        let logits =
            Lin::from_weight(self.embed.clone()).forward(&rms_norm(&h, &self.norm, EPS)?)?;
        if self.m == Mistake::LogitsScalingMultiplied {
            logits * LOGITS_SCALING
        } else {
            logits / LOGITS_SCALING
        }
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
