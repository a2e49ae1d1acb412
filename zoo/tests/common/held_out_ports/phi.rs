//! Phi (`transformers.models.phi`, Phi-1/Phi-2's layout): one LayerNorm per layer feeding the
//! attention and the MLP in parallel, partial rotary embeddings (`partial_rotary_factor` 0.5: the
//! first 8 dims of each 16-dim head), biases on every projection and on the head, `gelu_new` (the
//! tanh approximation), a final LayerNorm and an untied head.

use super::{
    angles, attend, cause, configured, decoded, decoding, heads, hidden_states, input_ids,
    layer_norm, port, rope, rotate, visible, Cache, Cause, Class, Groups, HeldOut, Kind, Lin,
    Pairs,
};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use golden::Layer;
use std::collections::BTreeMap;

const VOCAB: usize = 64;
const HIDDEN: usize = 32;
const HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const PARTIAL_ROTARY: f64 = 0.5;
/// `int(head_dim · partial_rotary_factor)`.
const ROTARY: usize = 8;
const INTERMEDIATE: usize = 64;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;
const THETA: f64 = 10_000.0;

/// The mistakes of a Phi port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    GeluErf,
    PartialRotaryIgnored,
    SequentialResidual,
    RotaryInterleaved,
    PositionsRestart,
    LayerNormEps,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.PhiConfig",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("intermediate_size", INTERMEDIATE.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("max_position_embeddings", 64usize.into()),
            ("layer_norm_eps", EPS.into()),
            ("hidden_act", "gelu_new".into()),
            (
                "rope_parameters",
                rope(THETA, &[("partial_rotary_factor", PARTIAL_ROTARY)]),
            ),
            ("qk_layernorm", false.into()),
            ("resid_pdrop", 0.0.into()),
            ("embd_pdrop", 0.0.into()),
            ("tie_word_embeddings", false.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    let class = |c: &str| format!("transformers.models.phi.modeling_phi.{c}");
    match kind {
        Kind::Attention => hidden_states(
            config(name, &class("PhiAttention")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Mlp => hidden_states(config(name, &class("PhiMLP")), HIDDEN),
        Kind::Layer => hidden_states(
            config(name, &class("PhiDecoderLayer")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Model => input_ids(config(name, "transformers.PhiForCausalLM"), VOCAB, 1, 8),
        Kind::Decode => decoded(config(name, "transformers.PhiForCausalLM"), VOCAB, 6, None),
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
        family: "phi",
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
        (Kind::Attention, "phi_right_attention"),
        (Kind::Mlp, "phi_right_mlp"),
        (Kind::Layer, "phi_right_layer"),
        (Kind::Model, "phi_right_model"),
        (Kind::Decode, "phi_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // `gelu_new` (NewGELUActivation, the tanh approximation) computed with the exact erf
        // GELU (`Tensor::gelu_erf`), by a porter who learnt that candle's `gelu` is the tanh one
        // and "fixed" it everywhere. Named: GELU (erf) at NewGELU's formula, called from the MLP.
        check(
            Kind::Mlp,
            "phi_gelu_erf",
            Mistake::GeluErf,
            Some(Class::Operation),
            vec![
                cause("erf", "transformers/activations.py:66"),
                cause("erf", "transformers/models/phi/modeling_phi.py:247"),
                // Added after a run (why at f944271), the same mistake said as the config value
                // that would select the erf GELU: "as if `hidden_act` were 'gelu' (the config
                // says 'gelu_new'), read at …:241".
                cause(
                    "`hidden_act` were 'gelu'",
                    "transformers/models/phi/modeling_phi.py:241",
                ),
            ],
        ),
        // Rotary embeddings on the whole head: `partial_rotary_factor` (0.5) never read.
        // Named: `rope_parameters['partial_rotary_factor']` where the rotary tables or the
        // attention read it, or the slice of the rotated dims.
        check(
            Kind::Attention,
            "phi_partial_rotary_ignored",
            Mistake::PartialRotaryIgnored,
            Some(Class::Configuration),
            vec![
                cause(
                    "partial_rotary_factor",
                    "transformers/models/phi/modeling_phi.py:61",
                ),
                cause(
                    "partial_rotary_factor",
                    "transformers/models/phi/modeling_phi.py:168",
                ),
                cause(
                    "rotary_ndims",
                    "transformers/models/phi/modeling_phi.py:200",
                ),
                cause(
                    "rotary_ndims",
                    "transformers/models/phi/modeling_phi.py:204",
                ),
            ],
        ),
        // Llama's order: `h = x + attn(ln(x))`, then `h + mlp(ln(h))` with the one LayerNorm,
        // where Phi runs both on `ln(x)` and adds them together. Named: the branches run in
        // sequence where the reference runs them in parallel, at the MLP's call or the sum.
        check(
            Kind::Layer,
            "phi_sequential_residual",
            Mistake::SequentialResidual,
            Some(Class::Structure),
            vec![
                cause("parallel", "transformers/models/phi/modeling_phi.py:285"),
                cause("parallel", "transformers/models/phi/modeling_phi.py:286"),
                cause("sequence", "transformers/models/phi/modeling_phi.py:285"),
                cause("sequence", "transformers/models/phi/modeling_phi.py:286"),
            ],
        ),
        // Rotary embeddings on interleaved pairs (candle's `rope_i`, GPT-J's layout) where Phi
        // rotates halves (`rotate_half`). Named: rotary on interleaved pairs at `rotate_half` or
        // where it is applied.
        check(
            Kind::Model,
            "phi_rotary_interleaved",
            Mistake::RotaryInterleaved,
            Some(Class::Structure),
            vec![
                cause("interleaved", "transformers/models/phi/modeling_phi.py:85"),
                cause("interleaved", "transformers/models/phi/modeling_phi.py:109"),
                cause("interleaved", "transformers/models/phi/modeling_phi.py:110"),
                cause("interleaved", "transformers/models/phi/modeling_phi.py:208"),
            ],
        ),
        // The rotary tables of every call start at position 0: the port never passes its
        // `seqlen_offset` to them, so a decode step is rotated as if it were the first token.
        // Named: positions that restart at 0 in every call (a mistake of driving: no line).
        check(
            Kind::Decode,
            "phi_positions_restart",
            Mistake::PositionsRestart,
            Some(Class::Driving),
            vec![cause("restart at 0", "")],
        ),
        // Every LayerNorm with eps 1e-6: the port's config struct reads `layer_norm_epsilon`
        // (GPT-2's and Falcon's name), which Phi's config does not have, and falls back to its
        // default. Named: `layer_norm_eps` where a LayerNorm is built with it, or the eps of the
        // LayerNorms' calls.
        check(
            Kind::Model,
            "phi_layer_norm_eps",
            Mistake::LayerNormEps,
            Some(Class::Configuration),
            vec![
                cause(
                    "`layer_norm_eps` were",
                    "transformers/models/phi/modeling_phi.py:257",
                ),
                cause(
                    "`layer_norm_eps` were",
                    "transformers/models/phi/modeling_phi.py:324",
                ),
                cause("eps=1e-06", "transformers/models/phi/modeling_phi.py:272"),
                cause("eps=1e-06", "transformers/models/phi/modeling_phi.py:379"),
            ],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

fn eps(m: Mistake) -> f64 {
    if m == Mistake::LayerNormEps {
        1e-6
    } else {
        EPS
    }
}

/// nn.LayerNorm with its bias.
struct Norm {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl Norm {
    fn new(vb: &VarBuilder, name: &str, m: Mistake) -> Result<Norm> {
        let vb = vb.pp(name);
        Ok(Norm {
            w: vb.get(HIDDEN, "weight")?,
            b: vb.get(HIDDEN, "bias")?,
            eps: eps(m),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.w, Some(&self.b), self.eps)
    }
}

/// `PhiAttention`, with its cache.
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    dense: Lin,
    m: Mistake,
    cache: Cache,
}

impl Attention {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            q: Lin::new(vb, "q_proj", HIDDEN, HIDDEN, true)?,
            k: Lin::new(vb, "k_proj", HIDDEN, HIDDEN, true)?,
            v: Lin::new(vb, "v_proj", HIDDEN, HIDDEN, true)?,
            dense: Lin::new(vb, "dense", HIDDEN, HIDDEN, true)?,
            m,
            cache: Cache::default(),
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let q = heads(&self.q.forward(x)?, HEADS, HEAD_DIM)?;
        let k = heads(&self.k.forward(x)?, HEADS, HEAD_DIM)?;
        let v = heads(&self.v.forward(x)?, HEADS, HEAD_DIM)?;
        let rotated = if self.m == Mistake::PartialRotaryIgnored {
            HEAD_DIM
        } else {
            ROTARY
        };
        let start = if self.m == Mistake::PositionsRestart {
            0
        } else {
            past
        };
        let a = angles(start, t, rotated, THETA, x.device())?;
        let pairs = if self.m == Mistake::RotaryInterleaved {
            Pairs::Interleaved
        } else {
            Pairs::Halves
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
        self.dense.forward(&y)
    }
}

/// `PhiMLP`: `fc2(gelu_new(fc1(x)))`.
struct Mlp {
    fc1: Lin,
    fc2: Lin,
    m: Mistake,
}

impl Mlp {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Mlp> {
        Ok(Mlp {
            fc1: Lin::new(vb, "fc1", INTERMEDIATE, HIDDEN, true)?,
            fc2: Lin::new(vb, "fc2", HIDDEN, INTERMEDIATE, true)?,
            m,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.forward(x)?;
        // candle's `gelu` is the tanh approximation, `gelu_new`'s.
        let h = if self.m == Mistake::GeluErf {
            h.gelu_erf()?
        } else {
            h.gelu()?
        };
        self.fc2.forward(&h)
    }
}

/// `PhiDecoderLayer`: `x + attn(ln(x)) + mlp(ln(x))`.
struct Block {
    norm: Norm,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<Block> {
        Ok(Block {
            norm: Norm::new(vb, "input_layernorm", m)?,
            attention: Attention::new(&vb.pp("self_attn"), m)?,
            mlp: Mlp::new(&vb.pp("mlp"), m)?,
            m,
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let normed = self.norm.forward(x)?;
        let attn = self.attention.forward(&normed, past)?;
        if self.m == Mistake::SequentialResidual {
            let h = (x + attn)?;
            return &h + self.mlp.forward(&self.norm.forward(&h)?)?;
        }
        (attn + self.mlp.forward(&normed)?)? + x
    }
}

/// `PhiForCausalLM`.
struct CausalLm {
    embed: Tensor,
    layers: Vec<Block>,
    final_norm: Norm,
    head: Lin,
}

impl CausalLm {
    fn new(vb: &VarBuilder, m: Mistake) -> Result<CausalLm> {
        let model = vb.pp("model");
        Ok(CausalLm {
            embed: model.get((VOCAB, HIDDEN), "embed_tokens.weight")?,
            layers: (0..LAYERS)
                .map(|i| Block::new(&model.pp("layers").pp(i), m))
                .collect::<Result<_>>()?,
            final_norm: Norm::new(&model, "final_layernorm", m)?,
            head: Lin::new(vb, "lm_head", VOCAB, HIDDEN, true)?,
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
        self.head.forward(&self.final_norm.forward(&h)?)
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
