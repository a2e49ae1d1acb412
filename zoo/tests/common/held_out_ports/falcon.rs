//! Falcon (`transformers.models.falcon`) with its new decoder architecture (Falcon-40B's and
//! 180B's layout), round 2: one fused `query_key_value` projection laid out per key/value group
//! (each group's queries, then its key, then its value), rotary embeddings, the attention and
//! the MLP in parallel on two LayerNorms of the same input (`ln_attn`, `ln_mlp`,
//! `num_ln_in_parallel_attn` 2), the exact GELU (`activation` "gelu"), no biases, tied
//! embeddings. candle-transformers 0.11.1's `falcon` (which refuses the new architecture) was
//! read for the mistakes below; one of them is its.

use super::{
    angles, attend, cause, configured, decoded, decoding, hidden_states, input_ids, layer_norm,
    port, rope, rotate, visible, Cache, Cause, Class, Groups, HeldOut, Kind, Lin, Pairs,
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
const FFN: usize = 64;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;
const THETA: f64 = 10_000.0;

const MODELING: &str = "transformers/models/falcon/modeling_falcon.py";

/// The mistakes of a Falcon port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    QkvInBlocks,
    GeluTanh,
    MlpOnAttentionNorm,
    MaskWithoutOffset,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.FalconConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("num_kv_heads", KV_HEADS.into()),
            ("new_decoder_architecture", true.into()),
            ("parallel_attn", true.into()),
            ("num_ln_in_parallel_attn", 2usize.into()),
            ("alibi", false.into()),
            ("bias", false.into()),
            ("ffn_hidden_size", FFN.into()),
            ("activation", "gelu".into()),
            ("layer_norm_epsilon", EPS.into()),
            ("max_position_embeddings", 64usize.into()),
            ("rope_parameters", rope(THETA, &[])),
            ("hidden_dropout", 0.0.into()),
            ("attention_dropout", 0.0.into()),
            ("tie_word_embeddings", true.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    match kind {
        Kind::Mlp => hidden_states(
            config(name, "transformers.models.falcon.modeling_falcon.FalconMLP"),
            HIDDEN,
        ),
        Kind::Model => input_ids(config(name, "transformers.FalconForCausalLM"), VOCAB, 1, 8),
        Kind::Decode => decoded(
            config(name, "transformers.FalconForCausalLM"),
            VOCAB,
            6,
            None,
        ),
        // Falcon's attention and decoder layer take the model's ALiBi tensor as an argument.
        Kind::Attention | Kind::Layer => unreachable!("checked through the model"),
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
        Kind::Mlp => port(move |i| Mlp::new(&i.var_builder(), m)?.forward(i.tensor(0))),
        Kind::Model => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
        Kind::Decode => decoding(move |vb| CausalLm::new(&vb, m), CausalLm::step),
        Kind::Attention | Kind::Layer => unreachable!(),
    };
    HeldOut {
        family: "falcon",
        name,
        kind,
        mistake: class,
        causes,
        layer,
        port,
    }
}

/// `file.py:line` of the modeling file.
fn at(line: u32) -> &'static str {
    Box::leak(format!("{MODELING}:{line}").into_boxed_str())
}

/// The right port, through every kind of check its wrong ports go through.
pub fn right() -> Vec<HeldOut> {
    [
        (Kind::Mlp, "falcon_right_mlp"),
        (Kind::Model, "falcon_right_model"),
        (Kind::Decode, "falcon_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // The fused projection split in three blocks (all queries, all keys, all values: the
        // layout of GPT-2's `c_attn` and Phi-3's `qkv_proj`), where the new architecture lays
        // it out per key/value group (`view(b, t, kv, heads/kv + 2, head_dim)`: a group's
        // queries, its key, its value). Named: the split of `query_key_value` at `_split_heads`.
        check(
            Kind::Model,
            "falcon_qkv_in_blocks",
            Mistake::QkvInBlocks,
            Some(Class::Structure),
            vec![
                cause("view", at(256)),
                cause("query_key_value", at(256)),
                cause("split", at(256)),
                cause("layout", at(256)),
                cause("qkv", at(256)),
                cause("query", at(257)),
                cause("key", at(258)),
                cause("value", at(259)),
            ],
        ),
        // candle's `Tensor::gelu` (the tanh approximation), which candle-transformers' Falcon
        // calls, where `activation` "gelu" is the exact erf GELU. Named: the GELU's tanh
        // approximation at the MLP's activation, or `activation` read as a tanh GELU.
        check(
            Kind::Mlp,
            "falcon_gelu_tanh",
            Mistake::GeluTanh,
            Some(Class::Operation),
            vec![
                cause("tanh", at(526)),
                cause("tanh", "transformers/activations.py:89"),
                cause("approximate", at(526)),
                cause("approximate", "transformers/activations.py:89"),
                cause("`activation` were", at(521)),
            ],
        ),
        // Both branches fed `ln_attn`'s output (Falcon-7B's single-norm path,
        // `mlp_layernorm_out = attention_layernorm_out`, kept when adding the new
        // architecture): `ln_mlp` is read and never applied. Named: `ln_mlp` (or
        // `num_ln_in_parallel_attn`) where the layer normalises the MLP's input.
        check(
            Kind::Model,
            "falcon_mlp_on_attention_norm",
            Mistake::MlpOnAttentionNorm,
            Some(Class::Structure),
            vec![
                cause("ln_mlp", at(583)),
                cause("ln_attn", at(583)),
                cause("num_ln_in_parallel_attn", at(581)),
                cause("num_ln_in_parallel_attn", at(559)),
                cause("mlp_layernorm_out", at(616)),
                cause("norm", at(583)),
            ],
        ),
        // The causal mask of a step of several tokens built as if the step started at 0 (key j
        // seen by query i when j ≤ i, i not offset by the cache's length) and none for a single
        // token: a prefill in chunks hides most of the cache from the later chunks. Named: the
        // causal mask not offset by the cache's length.
        check(
            Kind::Decode,
            "falcon_mask_without_offset",
            Mistake::MaskWithoutOffset,
            Some(Class::Driving),
            vec![
                cause("mask", ""),
                cause("causal", "transformers/masking_utils.py:76"),
            ],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

/// `FalconAttention`, new architecture, with its cache.
struct Attention {
    qkv: Lin,
    dense: Lin,
    m: Mistake,
    cache: Cache,
}

impl Attention {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            qkv: Lin::new(
                vb,
                "query_key_value",
                (HEADS + 2 * KV_HEADS) * HEAD_DIM,
                HIDDEN,
                false,
            )?,
            dense: Lin::new(vb, "dense", HIDDEN, HIDDEN, false)?,
            m,
            cache: Cache::default(),
        })
    }

    /// The queries `[b, heads, t, d]`, keys and values `[b, kv, t, d]` of the fused projection.
    fn split(&self, fused: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = fused.dims3()?;
        let heads = |x: Tensor, n: usize| -> Result<Tensor> {
            x.reshape((b, t, n, HEAD_DIM))?
                .transpose(1, 2)?
                .contiguous()
        };
        if self.m == Mistake::QkvInBlocks {
            let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
            return Ok((
                heads(fused.narrow(2, 0, q)?, HEADS)?,
                heads(fused.narrow(2, q, kv)?, KV_HEADS)?,
                heads(fused.narrow(2, q + kv, kv)?, KV_HEADS)?,
            ));
        }
        let per_group = HEADS / KV_HEADS;
        let grouped = fused.reshape((b, t, KV_HEADS, per_group + 2, HEAD_DIM))?;
        Ok((
            heads(grouped.narrow(3, 0, per_group)?.contiguous()?, HEADS)?,
            heads(grouped.narrow(3, per_group, 1)?.contiguous()?, KV_HEADS)?,
            heads(grouped.narrow(3, per_group + 1, 1)?.contiguous()?, KV_HEADS)?,
        ))
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let (q, k, v) = self.split(&self.qkv.forward(x)?)?;
        let a = angles(past, t, HEAD_DIM, THETA, x.device())?;
        let (q, k) = (
            rotate(&q, &a, Pairs::Halves)?,
            rotate(&k, &a, Pairs::Halves)?,
        );
        let (k, v) = self.cache.append(k, v)?;
        let seen = match (self.m, t) {
            (Mistake::MaskWithoutOffset, 1) => None,
            (Mistake::MaskWithoutOffset, _) => {
                let seen: Vec<u8> = (0..t)
                    .flat_map(|i| (0..past + t).map(move |j| u8::from(j <= i)))
                    .collect();
                Some(Tensor::from_vec(seen, (t, past + t), x.device())?)
            }
            _ => Some(visible(past, t, None, x.device())?),
        };
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        let y = attend(&q, &k, &v, scale, seen.as_ref(), Groups::Consecutive)?;
        self.dense.forward(&y)
    }
}

/// `FalconMLP`: the exact GELU between two projections without biases.
struct Mlp {
    up: Lin,
    down: Lin,
    m: Mistake,
}

impl Mlp {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Mlp> {
        Ok(Mlp {
            up: Lin::new(vb, "dense_h_to_4h", FFN, HIDDEN, false)?,
            down: Lin::new(vb, "dense_4h_to_h", HIDDEN, FFN, false)?,
            m,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.up.forward(x)?;
        let h = if self.m == Mistake::GeluTanh {
            h.gelu()?
        } else {
            h.gelu_erf()?
        };
        self.down.forward(&h)
    }
}

/// A LayerNorm with its bias.
struct Norm {
    w: Tensor,
    b: Tensor,
}

impl Norm {
    fn new(vb: &VarBuilder, name: &str) -> Result<Norm> {
        let vb = vb.pp(name);
        Ok(Norm {
            w: vb.get(HIDDEN, "weight")?,
            b: vb.get(HIDDEN, "bias")?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.w, Some(&self.b), EPS)
    }
}

/// `FalconDecoderLayer`, new architecture: `x + attn(ln_attn(x)) + mlp(ln_mlp(x))`.
struct Block {
    ln_attn: Norm,
    ln_mlp: Norm,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            ln_attn: Norm::new(vb, "ln_attn")?,
            ln_mlp: Norm::new(vb, "ln_mlp")?,
            attention: Attention::new(&vb.pp("self_attention"), m)?,
            mlp: Mlp::new(&vb.pp("mlp"), m)?,
            m,
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let attn_in = self.ln_attn.forward(x)?;
        let mlp_in = if self.m == Mistake::MlpOnAttentionNorm {
            attn_in.clone()
        } else {
            self.ln_mlp.forward(x)?
        };
        let a = self.attention.forward(&attn_in, past)?;
        let f = self.mlp.forward(&mlp_in)?;
        (x + a)? + f
    }
}

/// `FalconForCausalLM`, its head tied to the embeddings.
struct CausalLm {
    embed: Tensor,
    layers: Vec<Block>,
    ln_f: Norm,
}

impl CausalLm {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<CausalLm> {
        let model = vb.pp("transformer");
        Ok(CausalLm {
            embed: model.get((VOCAB, HIDDEN), "word_embeddings.weight")?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&model.pp("h").pp(i), m))
                .collect::<Result<_>>()?,
            ln_f: Norm::new(&model, "ln_f")?,
        })
    }

    fn forward(&mut self, ids: &Tensor, past: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        for layer in &mut self.layers {
            h = layer.forward(&h, past)?;
        }
        Lin::from_weight(self.embed.clone()).forward(&self.ln_f.forward(&h)?)
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
