//! OPT (`transformers.models.opt`), OPT-350m's layout: learned positions read two rows further on
//! (`position_ids + 2`), word embeddings of 16 dims projected in to the 32 of the layers and out
//! again before the tied head, post-norm layers (`do_layer_norm_before = False`: the norm after
//! each residual add, and no final norm), ReLU, biases everywhere, the queries scaled by 1/√d
//! before the scores (the kernel then scales by 1).

use super::{
    attend, cause, configured, decoded, decoding, heads, input_ids, layer_norm, port, visible,
    Cache, Cause, Class, Groups, HeldOut, Kind, Lin,
};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use golden::Layer;
use std::collections::BTreeMap;

const VOCAB: usize = 64;
const HIDDEN: usize = 32;
const WORD_DIM: usize = 16;
const HEADS: usize = 4;
const HEAD_DIM: usize = 8;
const FFN: usize = 64;
const LAYERS: usize = 2;
const POSITIONS: usize = 64;
/// `OPTLearnedPositionalEmbedding`'s offset.
const OFFSET: usize = 2;
/// nn.LayerNorm's default.
const EPS: f64 = 1e-5;

/// The mistakes of an OPT port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    PreNorm,
    GeluForRelu,
    PositionsWithoutOffset,
    QueriesScaledTwice,
    PositionsRestart,
}

// --- the checks ----------------------------------------------------------------------------------

fn layer(kind: Kind, name: &str) -> Layer {
    let model = configured(
        name,
        "transformers.OPTForCausalLM",
        "transformers.OPTConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("word_embed_proj_dim", WORD_DIM.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("ffn_dim", FFN.into()),
            ("max_position_embeddings", POSITIONS.into()),
            ("do_layer_norm_before", false.into()),
            ("activation_function", "relu".into()),
            ("dropout", 0.0.into()),
            ("attention_dropout", 0.0.into()),
            ("enable_bias", true.into()),
            ("tie_word_embeddings", true.into()),
            ("pad_token_id", 1usize.into()),
            ("bos_token_id", 2usize.into()),
            ("eos_token_id", 2usize.into()),
            ("init_std", 0.2.into()),
        ],
    );
    match kind {
        Kind::Model => input_ids(model, VOCAB, 1, 8),
        Kind::Decode => decoded(model, VOCAB, 6, None),
        other => panic!("OPT's ports are checked as a whole model, not as {other:?}"),
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
        Kind::Decode => decoding(move |vb| CausalLm::new(&vb, m), CausalLm::step),
        _ => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
    };
    HeldOut {
        family: "opt",
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
        (Kind::Model, "opt_right_model"),
        (Kind::Decode, "opt_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // The layers normalised before attention and MLP, as OPT-125m and every larger OPT do:
        // `do_layer_norm_before` (False, OPT-350m's post-norm) read for the final norm only (its
        // construction says so plainly) and not in the layers. Named: `do_layer_norm_before`
        // where the layer reads it or branches on it, or the layer's norms placed before their
        // branch (pre-norm for post-norm).
        check(
            Kind::Model,
            "opt_pre_norm",
            Mistake::PreNorm,
            Some(Class::Configuration),
            vec![
                cause(
                    "do_layer_norm_before",
                    "transformers/models/opt/modeling_opt.py:191",
                ),
                cause(
                    "do_layer_norm_before",
                    "transformers/models/opt/modeling_opt.py:214",
                ),
                cause(
                    "do_layer_norm_before",
                    "transformers/models/opt/modeling_opt.py:229",
                ),
                cause(
                    "do_layer_norm_before",
                    "transformers/models/opt/modeling_opt.py:238",
                ),
                cause(
                    "do_layer_norm_before",
                    "transformers/models/opt/modeling_opt.py:250",
                ),
                cause("pre-norm", "transformers/models/opt/modeling_opt.py:226"),
                cause("pre-norm", "transformers/models/opt/modeling_opt.py:230"),
                cause("pre-norm", "transformers/models/opt/modeling_opt.py:247"),
                cause("pre-norm", "transformers/models/opt/modeling_opt.py:251"),
            ],
        ),
        // The MLP's activation GELU (the port's MLP taken from BART's, whose config says
        // "gelu") where OPT's `activation_function` says ReLU. Named: `activation_function`
        // where the layer reads it, or GELU in place of the ReLU the layer calls.
        check(
            Kind::Model,
            "opt_gelu_for_relu",
            Mistake::GeluForRelu,
            Some(Class::Configuration),
            vec![
                cause(
                    "activation_function",
                    "transformers/models/opt/modeling_opt.py:193",
                ),
                cause("GELU", "transformers/models/opt/modeling_opt.py:242"),
                cause("gelu", "transformers/models/opt/modeling_opt.py:242"),
            ],
        ),
        // The learned positions read at `position` where OPT reads row `position + 2`. Named:
        // the offset of 2 left out at the positional embedding's forward.
        check(
            Kind::Model,
            "opt_positions_without_offset",
            Mistake::PositionsWithoutOffset,
            Some(Class::Operation),
            vec![cause(
                "offset",
                "transformers/models/opt/modeling_opt.py:70",
            )],
        ),
        // The queries scaled by 1/√d as OPT does, and the scores scaled again by the attention's
        // usual 1/√d (OPT's kernel is called with `scaling=1.0`). Named: the extra scale, at
        // the queries' product or the kernel's scale.
        check(
            Kind::Model,
            "opt_queries_scaled_twice",
            Mistake::QueriesScaledTwice,
            Some(Class::Operation),
            vec![
                cause("scal", "transformers/models/opt/modeling_opt.py:151"),
                cause("scal", "transformers/models/opt/modeling_opt.py:174"),
                cause("scale", "transformers/integrations/sdpa_attention.py:193"),
                // Added after the first run (main's diagnosis, aa64120), the same mistake said
                // as the queries' factor squared: "Tensor.mul by 0.125 … instead of 0.353553 …
                // (the factor squared) at modeling_opt.py:151".
                cause(
                    "factor squared",
                    "transformers/models/opt/modeling_opt.py:151",
                ),
            ],
        ),
        // The learned positions of every call counted from 0: the port never adds the cache's
        // length (`past_key_values_length`). Named: positions that restart at 0 in every call.
        check(
            Kind::Decode,
            "opt_positions_restart",
            Mistake::PositionsRestart,
            Some(Class::Driving),
            vec![cause("restart at 0", "")],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

/// nn.LayerNorm with its bias.
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

/// `OPTAttention`, with its cache.
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    out: Lin,
    m: Mistake,
    cache: Cache,
}

impl Attention {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            q: Lin::new(vb, "q_proj", HIDDEN, HIDDEN, true)?,
            k: Lin::new(vb, "k_proj", HIDDEN, HIDDEN, true)?,
            v: Lin::new(vb, "v_proj", HIDDEN, HIDDEN, true)?,
            out: Lin::new(vb, "out_proj", HIDDEN, HIDDEN, true)?,
            m,
            cache: Cache::default(),
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let scaling = 1.0 / (HEAD_DIM as f64).sqrt();
        let q = heads(&(self.q.forward(x)? * scaling)?, HEADS, HEAD_DIM)?;
        let k = heads(&self.k.forward(x)?, HEADS, HEAD_DIM)?;
        let v = heads(&self.v.forward(x)?, HEADS, HEAD_DIM)?;
        let (k, v) = self.cache.append(k, v)?;
        let seen = visible(past, t, None, x.device())?;
        let scale = if self.m == Mistake::QueriesScaledTwice {
            scaling
        } else {
            1.0
        };
        let y = attend(&q, &k, &v, scale, Some(&seen), Groups::Consecutive)?;
        self.out.forward(&y)
    }
}

/// `OPTDecoderLayer`, post-norm (OPT-350m's).
struct Block {
    attn_norm: Norm,
    attention: Attention,
    fc1: Lin,
    fc2: Lin,
    final_norm: Norm,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            attn_norm: Norm::new(vb, "self_attn_layer_norm")?,
            attention: Attention::new(&vb.pp("self_attn"), m)?,
            fc1: Lin::new(vb, "fc1", FFN, HIDDEN, true)?,
            fc2: Lin::new(vb, "fc2", HIDDEN, FFN, true)?,
            final_norm: Norm::new(vb, "final_layer_norm")?,
            m,
        })
    }

    fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.forward(x)?;
        let h = if self.m == Mistake::GeluForRelu {
            h.gelu_erf()?
        } else {
            h.relu()?
        };
        self.fc2.forward(&h)
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        if self.m == Mistake::PreNorm {
            let h = (x + self.attention.forward(&self.attn_norm.forward(x)?, past)?)?;
            return &h + self.mlp(&self.final_norm.forward(&h)?)?;
        }
        let h = self
            .attn_norm
            .forward(&(x + self.attention.forward(x, past)?)?)?;
        self.final_norm.forward(&(&h + self.mlp(&h)?)?)
    }
}

/// `OPTForCausalLM`, its head tied to the word embeddings.
struct CausalLm {
    embed: Tensor,
    positions: Tensor,
    project_in: Lin,
    layers: Vec<Block>,
    project_out: Lin,
    m: Mistake,
}

impl CausalLm {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<CausalLm> {
        let d = vb.pp("model").pp("decoder");
        Ok(CausalLm {
            embed: d.get((VOCAB, WORD_DIM), "embed_tokens.weight")?,
            positions: d.get((POSITIONS + OFFSET, HIDDEN), "embed_positions.weight")?,
            project_in: Lin::new(&d, "project_in", HIDDEN, WORD_DIM, false)?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&d.pp("layers").pp(i), m))
                .collect::<Result<_>>()?,
            project_out: Lin::new(&d, "project_out", WORD_DIM, HIDDEN, false)?,
            m,
        })
    }

    fn forward(&mut self, ids: &Tensor, past: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let words = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, WORD_DIM))?;
        let start = if self.m == Mistake::PositionsRestart {
            0
        } else {
            past
        };
        let offset = if self.m == Mistake::PositionsWithoutOffset {
            0
        } else {
            OFFSET
        };
        let rows = Tensor::arange(
            (start + offset) as u32,
            (start + offset + t) as u32,
            ids.device(),
        )?;
        let positions = self.positions.index_select(&rows, 0)?.unsqueeze(0)?;
        let mut h = self.project_in.forward(&words)?.broadcast_add(&positions)?;
        for layer in &mut self.layers {
            h = layer.forward(&h, past)?;
        }
        let h = self.project_out.forward(&h)?;
        Lin::from_weight(self.embed.clone()).forward(&h)
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
