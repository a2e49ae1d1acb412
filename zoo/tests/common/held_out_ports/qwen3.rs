//! Qwen3 (`transformers.models.qwen3`): Llama's layout with an RMS norm on each query and key
//! head before the rotary embedding, a `head_dim` of its own (16 here, where hidden / heads is 8),
//! grouped key/value heads (4 query heads on 2), a rotary base of 10⁶, tied embeddings, and a
//! sliding window on the layers from `max_window_layers` on (`use_sliding_window`: here layer 1
//! of 2, window 4). candle-transformers' `qwen3` refuses a sliding window; this port has one.

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
const HEAD_DIM: usize = 16;
const INTERMEDIATE: usize = 64;
const LAYERS: usize = 2;
const EPS: f64 = 1e-6;
const THETA: f64 = 1e6;
const WINDOW: usize = 4;
/// Layers from this one on have the window.
const MAX_WINDOW_LAYERS: usize = 1;

/// The mistakes of a Qwen3 port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    QkNormAfterRotary,
    KvHeadsTiled,
    RmsEpsDefault,
    RopeThetaDefault,
    WindowLayersInverted,
    WindowOneWider,
}

// --- the checks ----------------------------------------------------------------------------------

fn config(name: &str, reference: &str) -> Layer {
    configured(
        name,
        reference,
        "transformers.Qwen3Config",
        &[
            ("vocab_size", VOCAB.into()),
            ("hidden_size", HIDDEN.into()),
            ("intermediate_size", INTERMEDIATE.into()),
            ("num_hidden_layers", LAYERS.into()),
            ("num_attention_heads", HEADS.into()),
            ("num_key_value_heads", KV_HEADS.into()),
            ("head_dim", HEAD_DIM.into()),
            ("max_position_embeddings", 64usize.into()),
            ("rms_norm_eps", EPS.into()),
            ("rope_parameters", rope(THETA, &[])),
            ("use_sliding_window", true.into()),
            ("sliding_window", WINDOW.into()),
            ("max_window_layers", MAX_WINDOW_LAYERS.into()),
            ("tie_word_embeddings", true.into()),
            ("initializer_range", 0.2.into()),
        ],
    )
}

fn layer(kind: Kind, name: &str) -> Layer {
    let class = |c: &str| format!("transformers.models.qwen3.modeling_qwen3.{c}");
    match kind {
        Kind::Attention => hidden_states(
            config(name, &class("Qwen3Attention")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Mlp => hidden_states(config(name, &class("Qwen3MLP")), HIDDEN),
        Kind::Layer => hidden_states(
            config(name, &class("Qwen3DecoderLayer")).init("layer_idx", 0usize),
            HIDDEN,
        ),
        Kind::Model => input_ids(config(name, "transformers.Qwen3ForCausalLM"), VOCAB, 1, 8),
        // Lengths up to 2w + 1, drawn around the window.
        Kind::Decode => decoded(
            config(name, "transformers.Qwen3ForCausalLM"),
            VOCAB,
            2 * WINDOW + 1,
            Some(WINDOW),
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
            let out = Attention::new(&i.var_builder(), 0, m)?.forward(i.tensor(0), 0)?;
            Ok((out,))
        }),
        Kind::Mlp => port(move |i| Mlp::new(&i.var_builder())?.forward(i.tensor(0))),
        Kind::Layer => port(move |i| Block::new(&i.var_builder(), 0, m)?.forward(i.tensor(0), 0)),
        Kind::Model => port(move |i| {
            let logits = CausalLm::new(&i.var_builder(), m)?.forward(i.tensor(0), 0)?;
            Ok(BTreeMap::from([("logits", logits)]))
        }),
        Kind::Decode => decoding(move |vb| CausalLm::new(&vb, m), CausalLm::step),
    };
    HeldOut {
        family: "qwen3",
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
        (Kind::Attention, "qwen3_right_attention"),
        (Kind::Layer, "qwen3_right_layer"),
        (Kind::Model, "qwen3_right_model"),
        (Kind::Decode, "qwen3_right_decode"),
    ]
    .into_iter()
    .map(|(kind, name)| check(kind, name, Mistake::None, None, vec![]))
    .collect()
}

/// The wrong ports: the mistake, and the cause a correct diagnosis names.
pub fn wrong() -> Vec<HeldOut> {
    vec![
        // The per-head RMS norms applied after the rotary embedding (as a port that rotates right
        // after the projections, then normalises): transformers normalises the projected heads,
        // then rotates them. Named: the two in the other order, at the norm's line or the
        // rotary's.
        check(
            Kind::Attention,
            "qwen3_qk_norm_after_rotary",
            Mistake::QkNormAfterRotary,
            Some(Class::Structure),
            vec![
                cause("order", "transformers/models/qwen3/modeling_qwen3.py:244"),
                cause("order", "transformers/models/qwen3/modeling_qwen3.py:245"),
                cause("order", "transformers/models/qwen3/modeling_qwen3.py:249"),
            ],
        ),
        // Grouped key/value heads tiled (query head h reads kv head h % 2) where transformers
        // repeats each kv head for consecutive query heads (h / 2): under sdpa, the kernel's
        // `enable_gqa`, else `repeat_kv`. Named: the kv heads tiled (or `repeat` for
        // `repeat_interleave`) at the kernel's call or at `repeat_kv`.
        check(
            Kind::Attention,
            "qwen3_kv_heads_tiled",
            Mistake::KvHeadsTiled,
            Some(Class::Structure),
            vec![
                cause("til", "transformers/integrations/sdpa_attention.py:193"),
                cause("til", "transformers/integrations/sdpa_attention.py:137"),
                cause("til", "transformers/integrations/sdpa_attention.py:28"),
                cause("repeat", "transformers/integrations/sdpa_attention.py:193"),
                cause("repeat", "transformers/integrations/sdpa_attention.py:137"),
                cause("repeat", "transformers/integrations/sdpa_attention.py:28"),
            ],
        ),
        // Every RMS norm with eps 1e-5 (Llama 2's, the port's norm helper's default) where the
        // config says 1e-6. Named: `rms_norm_eps` at a line reading it, or the eps at the norm's
        // `variance + self.variance_epsilon`.
        check(
            Kind::Layer,
            "qwen3_rms_eps_default",
            Mistake::RmsEpsDefault,
            Some(Class::Configuration),
            vec![
                cause(
                    "`rms_norm_eps` were",
                    "transformers/models/qwen3/modeling_qwen3.py:283",
                ),
                cause(
                    "`rms_norm_eps` were",
                    "transformers/models/qwen3/modeling_qwen3.py:284",
                ),
                cause(
                    "`rms_norm_eps` were",
                    "transformers/models/qwen3/modeling_qwen3.py:229",
                ),
                cause(
                    "`rms_norm_eps` were",
                    "transformers/models/qwen3/modeling_qwen3.py:230",
                ),
                cause("eps", "transformers/models/qwen3/modeling_qwen3.py:62"),
                // Added after a run (why at f944271), the same mistake said as the constant of
                // the norm's add: "Tensor.add with 1e-05 instead of 1e-06 at …:62".
                cause(
                    "1e-05 instead of 1e-06",
                    "transformers/models/qwen3/modeling_qwen3.py:62",
                ),
            ],
        ),
        // The rotary base 10000 (the default a port falls back to when it reads a top-level
        // `rope_theta`, which transformers 5 keeps in `rope_parameters`) for the config's 10⁶.
        // Named: `rope_parameters['rope_theta']` where it is read, or the base in the frequencies.
        check(
            Kind::Model,
            "qwen3_rope_theta_default",
            Mistake::RopeThetaDefault,
            Some(Class::Configuration),
            vec![
                cause(
                    "rope_theta",
                    "transformers/models/qwen3/modeling_qwen3.py:113",
                ),
                cause("10000", "transformers/models/qwen3/modeling_qwen3.py:118"),
            ],
        ),
        // `max_window_layers` read the other way: the window on the layers below it (layer 0)
        // instead of from it on (layer 1) — transformers' own Qwen2 docs once said it so. Named:
        // the per-layer selection, `max_window_layers` where `layer_types` is derived from it or
        // `layer_types` where a layer picks its mask.
        check(
            Kind::Decode,
            "qwen3_window_layers_inverted",
            Mistake::WindowLayersInverted,
            Some(Class::Configuration),
            vec![
                cause(
                    "max_window_layers",
                    "transformers/models/qwen3/configuration_qwen3.py:94",
                ),
                cause(
                    "layer_types",
                    "transformers/models/qwen3/configuration_qwen3.py:94",
                ),
                cause(
                    "layer_types",
                    "transformers/models/qwen3/modeling_qwen3.py:208",
                ),
                cause(
                    "layer_types",
                    "transformers/models/qwen3/modeling_qwen3.py:407",
                ),
            ],
        ),
        // The window keeps one key more (`j ≥ i − w`, candle-transformers' Mistral mask) than
        // transformers' `kv_idx > q_idx - sliding_window`. Named: the window's bound at that line,
        // or the schedule's "sliding window one key wider".
        check(
            Kind::Decode,
            "qwen3_window_one_wider",
            Mistake::WindowOneWider,
            Some(Class::Structure),
            vec![
                cause("sliding_window", "transformers/masking_utils.py:95"),
                cause("one key wider", ""),
                // Added after the first run (main's diagnosis, aa64120), the same mistake in
                // the schedule's words: "a sliding window of 5 keys (instead of 4 keys …)".
                cause("sliding window of 5 keys", ""),
            ],
        ),
    ]
}

// --- the port ------------------------------------------------------------------------------------

fn eps(m: Mistake) -> f64 {
    if m == Mistake::RmsEpsDefault {
        1e-5
    } else {
        EPS
    }
}

fn theta(m: Mistake) -> f64 {
    if m == Mistake::RopeThetaDefault {
        10_000.0
    } else {
        THETA
    }
}

/// The window of layer `index`, if it has one.
fn window(index: usize, m: Mistake) -> Option<usize> {
    let sliding = if m == Mistake::WindowLayersInverted {
        index < MAX_WINDOW_LAYERS
    } else {
        index >= MAX_WINDOW_LAYERS
    };
    let w = if m == Mistake::WindowOneWider {
        WINDOW + 1
    } else {
        WINDOW
    };
    sliding.then_some(w)
}

/// `Qwen3Attention`, with its cache.
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    q_norm: Tensor,
    k_norm: Tensor,
    index: usize,
    m: Mistake,
    cache: Cache,
}

impl Attention {
    fn new(vb: &VarBuilder, index: usize, m: Mistake) -> Result<Attention> {
        Ok(Attention {
            q: Lin::new(vb, "q_proj", HEADS * HEAD_DIM, HIDDEN, false)?,
            k: Lin::new(vb, "k_proj", KV_HEADS * HEAD_DIM, HIDDEN, false)?,
            v: Lin::new(vb, "v_proj", KV_HEADS * HEAD_DIM, HIDDEN, false)?,
            o: Lin::new(vb, "o_proj", HIDDEN, HEADS * HEAD_DIM, false)?,
            q_norm: vb.get(HEAD_DIM, "q_norm.weight")?,
            k_norm: vb.get(HEAD_DIM, "k_norm.weight")?,
            index,
            m,
            cache: Cache::default(),
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let t = x.dim(1)?;
        let q = heads(&self.q.forward(x)?, HEADS, HEAD_DIM)?;
        let k = heads(&self.k.forward(x)?, KV_HEADS, HEAD_DIM)?;
        let v = heads(&self.v.forward(x)?, KV_HEADS, HEAD_DIM)?;
        let a = angles(past, t, HEAD_DIM, theta(self.m), x.device())?;
        let e = eps(self.m);
        let (q, k) = if self.m == Mistake::QkNormAfterRotary {
            let q = rms_norm(&rotate(&q, &a, Pairs::Halves)?, &self.q_norm, e)?;
            let k = rms_norm(&rotate(&k, &a, Pairs::Halves)?, &self.k_norm, e)?;
            (q, k)
        } else {
            let q = rotate(&rms_norm(&q, &self.q_norm, e)?, &a, Pairs::Halves)?;
            let k = rotate(&rms_norm(&k, &self.k_norm, e)?, &a, Pairs::Halves)?;
            (q, k)
        };
        let (k, v) = self.cache.append(k, v)?;
        let seen = visible(past, t, window(self.index, self.m), x.device())?;
        let groups = if self.m == Mistake::KvHeadsTiled {
            Groups::Tiled
        } else {
            Groups::Consecutive
        };
        let y = attend(
            &q,
            &k,
            &v,
            1.0 / (HEAD_DIM as f64).sqrt(),
            Some(&seen),
            groups,
        )?;
        self.o.forward(&y)
    }
}

/// `Qwen3MLP`: SwiGLU.
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

/// `Qwen3DecoderLayer`: pre-norm attention, then pre-norm MLP.
struct Block {
    input_norm: Tensor,
    post_norm: Tensor,
    attention: Attention,
    mlp: Mlp,
    m: Mistake,
}

impl Block {
    fn new(vb: &VarBuilder, index: usize, m: Mistake) -> Result<Block> {
        Ok(Block {
            input_norm: vb.get(HIDDEN, "input_layernorm.weight")?,
            post_norm: vb.get(HIDDEN, "post_attention_layernorm.weight")?,
            attention: Attention::new(&vb.pp("self_attn"), index, m)?,
            mlp: Mlp::new(&vb.pp("mlp"))?,
            m,
        })
    }

    fn forward(&mut self, x: &Tensor, past: usize) -> Result<Tensor> {
        let e = eps(self.m);
        let h = (x + self
            .attention
            .forward(&rms_norm(x, &self.input_norm, e)?, past)?)?;
        &h + self.mlp.forward(&rms_norm(&h, &self.post_norm, e)?)?
    }
}

/// `Qwen3ForCausalLM`, its head tied to the embeddings.
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
                .map(|i| Block::new(&model.pp("layers").pp(i), i, m))
                .collect::<Result<_>>()?,
            norm: model.get(HIDDEN, "norm.weight")?,
            m,
        })
    }

    /// The logits `[b, t, vocab]` of `ids` `[b, t]` after `past` cached positions.
    fn forward(&mut self, ids: &Tensor, past: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut h = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, HIDDEN))?;
        for layer in &mut self.layers {
            h = layer.forward(&h, past)?;
        }
        let h = rms_norm(&h, &self.norm, eps(self.m))?;
        Lin::from_weight(self.embed.clone()).forward(&h)
    }

    fn step(&mut self, step: &golden::Step) -> Result<Tensor> {
        self.forward(step.input("input_ids")?, step.offset())
    }
}
