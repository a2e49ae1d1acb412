//! BLOOM (`transformers.models.bloom`), round 2: no position embeddings but ALiBi (a bias of
//! `slope_h · key position` added to each head's scores, unscaled, by `baddbmm`), with
//! BLOOM's slopes for a head count that is not a power of two (6 here, as BLOOM-176B's 112 is
//! not); a LayerNorm on the embeddings, one fused `query_key_value` projection laid out per head
//! (`view(b, t, heads, 3, head_dim)`), pre-norm blocks whose MLP adds its own residual, the tanh
//! GELU written out (`bloom_gelu_forward`), biases everywhere, tied embeddings. candle-transformers
//! has no BLOOM; its MPT (ALiBi) and Falcon were read for the mistakes below.

use super::{
    cause, configured, heads, hidden_states, input_ids, layer_norm, port, visible, Cause, Class,
    HeldOut, Kind, Lin,
};
use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::Layer;
use std::collections::BTreeMap;

const VOCAB: usize = 64;
const HIDDEN: usize = 24;
const HEADS: usize = 6;
const HEAD_DIM: usize = 4;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;

const MODELING: &str = "transformers/models/bloom/modeling_bloom.py";

/// The mistakes of a BLOOM port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    AlibiSlopesGeometric,
    AlibiScaled,
    EmbeddingNormLeftOut,
    QkvInBlocks,
    GeluErf,
    ResidualFromNorm,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.BloomConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("n_layer", LAYERS.into()),
            ("n_head", HEADS.into()),
            ("layer_norm_epsilon", EPS.into()),
            ("apply_residual_connection_post_layernorm", false.into()),
            ("hidden_dropout", 0.0.into()),
            ("attention_dropout", 0.0.into()),
            ("pretraining_tp", 1usize.into()),
            ("tie_word_embeddings", true.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    match kind {
        // BloomMLP.forward(hidden_states, residual).
        Kind::Mlp => hidden_states(
            config(name, "transformers.models.bloom.modeling_bloom.BloomMLP"),
            HIDDEN,
        )
        .arg(
            "residual",
            ["b".into(), "t".into(), golden::DimExpr::Lit(HIDDEN)],
            golden::Dist::default(),
        ),
        Kind::Model => input_ids(config(name, "transformers.BloomForCausalLM"), VOCAB, 1, 8),
        // BLOOM's attention and block take the model's ALiBi tensor and mask as arguments.
        _ => unreachable!("BLOOM is checked as a whole model and its MLP"),
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
        Kind::Mlp => {
            port(move |i| Mlp::new(&i.var_builder(), m)?.forward(i.tensor(0), i.tensor(1)))
        }
        Kind::Model => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0))?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
        _ => unreachable!(),
    };
    HeldOut {
        family: "bloom",
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
        (Kind::Mlp, "bloom_right_mlp"),
        (Kind::Model, "bloom_right_model"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    // A cause at any line of `_get_alibi_slopes` (45–58) or where the model multiplies the
    // slopes by the key positions (513–514), saying `words`.
    let slopes = |words: &'static str| -> Vec<Cause> {
        (45..=58)
            .chain(513..=514)
            .map(|line| cause(words, at(line)))
            .collect()
    };
    vec![
        // The slopes of ALiBi's paper for a power of two, `2^(-8h/n)` for h = 1..n, used for
        // 6 heads, where BLOOM takes the 4 slopes of the closest power of two and interleaves
        // 2 of the next one's. Named: the slopes, where `_get_alibi_slopes` computes them or the
        // model applies them.
        check(
            Kind::Model,
            "bloom_alibi_slopes_geometric",
            Mistake::AlibiSlopesGeometric,
            Some(Class::Operation),
            [slopes("slope"), slopes("alibi"), slopes("power")].concat(),
        ),
        // The ALiBi bias scaled with the scores (`(q·k + alibi) / √d`, or Falcon-RW's
        // `alibi / √head_dim`), where BLOOM adds it unscaled (`baddbmm` with beta 1, alpha
        // 1/√d). Named: the bias's scale at the `baddbmm`.
        check(
            Kind::Model,
            "bloom_alibi_scaled",
            Mistake::AlibiScaled,
            Some(Class::Operation),
            vec![
                cause("alibi", at(270)),
                cause("beta", at(270)),
                cause("alpha", at(270)),
                cause("baddbmm", at(270)),
                cause("scale", at(270)),
            ],
        ),
        // `word_embeddings_layernorm` loaded and never applied (BLOOM's one norm that other
        // GPT-like models do not have). Named: that norm left out where the model applies it.
        check(
            Kind::Model,
            "bloom_embedding_norm_left_out",
            Mistake::EmbeddingNormLeftOut,
            Some(Class::Structure),
            vec![
                cause("word_embeddings_layernorm", at(499)),
                cause("layer_norm", at(499)),
                cause("left out", at(499)),
                cause("norm", at(499)),
            ],
        ),
        // The fused projection split in three blocks (all queries, all keys, all values: GPT-2's
        // `c_attn`), where BLOOM lays it out per head (`view(b, t, heads, 3, head_dim)`). Named:
        // the split at `_reshape`.
        check(
            Kind::Model,
            "bloom_qkv_in_blocks",
            Mistake::QkvInBlocks,
            Some(Class::Structure),
            vec![
                cause("view", at(214)),
                cause("query_key_value", at(214)),
                cause("split", at(214)),
                cause("layout", at(214)),
                cause("qkv", at(214)),
                cause("query", at(215)),
                cause("key", at(216)),
                cause("value", at(217)),
            ],
        ),
        // The exact GELU (`Tensor::gelu_erf`, "PyTorch's default") where BLOOM writes the tanh
        // approximation out. Named: erf in place of the tanh formula of `bloom_gelu_forward`.
        check(
            Kind::Mlp,
            "bloom_gelu_erf",
            Mistake::GeluErf,
            Some(Class::Operation),
            vec![
                cause("erf", at(120)),
                cause("tanh", at(120)),
                cause("gelu", at(120)),
                cause("erf", at(326)),
            ],
        ),
        // Each residual taken from the LayerNorm's output (`apply_residual_connection_post_
        // layernorm` read as true, as Megatron's option is in some BLOOM-like checkpoints),
        // where this config (and every BLOOM) has it false. Named: that field, or the residual,
        // where the block chooses it.
        check(
            Kind::Model,
            "bloom_residual_from_norm",
            Mistake::ResidualFromNorm,
            Some(Class::Configuration),
            vec![
                cause("apply_residual_connection_post_layernorm", at(356)),
                cause("apply_residual_connection_post_layernorm", at(375)),
                cause("apply_residual_connection_post_layernorm", at(394)),
                cause("residual", at(376)),
                cause("residual", at(378)),
                cause("residual", at(395)),
                cause("residual", at(397)),
            ],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

/// BLOOM's ALiBi slopes, one per head.
fn slopes(m: Mistake) -> Vec<f32> {
    if m == Mistake::AlibiSlopesGeometric {
        return (1..=HEADS)
            .map(|h| 2f32.powf(-8.0 * h as f32 / HEADS as f32))
            .collect();
    }
    let closest = 1usize << HEADS.ilog2();
    let base = 2f32.powf(-(2f32.powf(-((closest as f32).log2() - 3.0))));
    let mut out: Vec<f32> = (1..=closest).map(|p| base.powi(p as i32)).collect();
    if closest != HEADS {
        let extra = 2f32.powf(-(2f32.powf(-((2.0 * closest as f32).log2() - 3.0))));
        let remaining = closest.min(HEADS - closest);
        out.extend((0..remaining).map(|i| extra.powi(2 * i as i32 + 1)));
    }
    out
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

/// `BloomAttention` (no cache: checked one forward at a time): the output projection plus the
/// residual.
struct Attention {
    qkv: Lin,
    dense: Lin,
    m: Mistake,
}

impl Attention {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            qkv: Lin::new(vb, "query_key_value", 3 * HIDDEN, HIDDEN, true)?,
            dense: Lin::new(vb, "dense", HIDDEN, HIDDEN, true)?,
            m,
        })
    }

    /// `alibi`: `[heads, 1, t]`, each head's slope times the key's position.
    fn forward(&self, x: &Tensor, residual: &Tensor, alibi: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let fused = self.qkv.forward(x)?;
        let (q, k, v) = if self.m == Mistake::QkvInBlocks {
            (
                heads(&fused.narrow(2, 0, HIDDEN)?, HEADS, HEAD_DIM)?,
                heads(&fused.narrow(2, HIDDEN, HIDDEN)?, HEADS, HEAD_DIM)?,
                heads(&fused.narrow(2, 2 * HIDDEN, HIDDEN)?, HEADS, HEAD_DIM)?,
            )
        } else {
            let per_head = fused.reshape((b, t, HEADS, 3, HEAD_DIM))?;
            let part = |i: usize| -> Result<Tensor> {
                per_head
                    .narrow(3, i, 1)?
                    .squeeze(3)?
                    .transpose(1, 2)?
                    .contiguous()
            };
            (part(0)?, part(1)?, part(2)?)
        };
        let inv_norm = 1.0 / (HEAD_DIM as f64).sqrt();
        let qk = q.matmul(&k.t()?)?;
        let scores = if self.m == Mistake::AlibiScaled {
            (qk.broadcast_add(alibi)? * inv_norm)?
        } else {
            (qk * inv_norm)?.broadcast_add(alibi)?
        };
        let seen = visible(0, t, None, x.device())?;
        let floor = Tensor::full(f32::NEG_INFINITY, scores.shape(), x.device())?;
        let scores = seen
            .broadcast_as(scores.shape())?
            .where_cond(&scores, &floor)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, HIDDEN))?;
        self.dense.forward(&y)? + residual
    }
}

/// `BloomMLP`: the tanh GELU between two projections, plus the residual it is given.
struct Mlp {
    up: Lin,
    down: Lin,
    m: Mistake,
}

impl Mlp {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Mlp> {
        Ok(Mlp {
            up: Lin::new(vb, "dense_h_to_4h", 4 * HIDDEN, HIDDEN, true)?,
            down: Lin::new(vb, "dense_4h_to_h", HIDDEN, 4 * HIDDEN, true)?,
            m,
        })
    }

    fn forward(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let h = self.up.forward(x)?;
        let h = if self.m == Mistake::GeluErf {
            h.gelu_erf()?
        } else {
            h.gelu()?
        };
        self.down.forward(&h)? + residual
    }
}

/// `BloomBlock`: pre-norm attention and MLP, each adding its residual.
struct Block {
    input_norm: Norm,
    post_attention_norm: Norm,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            input_norm: Norm::new(vb, "input_layernorm")?,
            post_attention_norm: Norm::new(vb, "post_attention_layernorm")?,
            attention: Attention::new(&vb.pp("self_attention"), m)?,
            mlp: Mlp::new(&vb.pp("mlp"), m)?,
            m,
        })
    }

    fn forward(&self, x: &Tensor, alibi: &Tensor) -> Result<Tensor> {
        let from_norm = self.m == Mistake::ResidualFromNorm;
        let normed = self.input_norm.forward(x)?;
        let residual = if from_norm { &normed } else { x };
        let a = self.attention.forward(&normed, residual, alibi)?;
        let normed = self.post_attention_norm.forward(&a)?;
        let residual = if from_norm { &normed } else { &a };
        self.mlp.forward(&normed, residual)
    }
}

/// `BloomForCausalLM`, its head tied to the embeddings.
struct CausalLm {
    embed: Tensor,
    embed_norm: Norm,
    layers: Vec<Block>,
    ln_f: Norm,
    m: Mistake,
}

impl CausalLm {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<CausalLm> {
        let model = vb.pp("transformer");
        Ok(CausalLm {
            embed: model.get((VOCAB, HIDDEN), "word_embeddings.weight")?,
            embed_norm: Norm::new(&model, "word_embeddings_layernorm")?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&model.pp("h").pp(i), m))
                .collect::<Result<_>>()?,
            ln_f: Norm::new(&model, "ln_f")?,
            m,
        })
    }

    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let dev = ids.device();
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        if self.m != Mistake::EmbeddingNormLeftOut {
            h = self.embed_norm.forward(&h)?;
        }
        let positions: Vec<f32> = (0..t).map(|j| j as f32).collect();
        let alibi = Tensor::from_vec(slopes(self.m), (HEADS, 1, 1), dev)?
            .broadcast_mul(&Tensor::from_vec(positions, (1, 1, t), dev)?)?;
        for layer in &self.layers {
            h = layer.forward(&h, &alibi)?;
        }
        Lin::from_weight(self.embed.clone()).forward(&self.ln_f.forward(&h)?)
    }
}
