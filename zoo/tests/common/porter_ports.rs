//! Ports of Hugging Face modules as a porter writes them, each right or with one of the mistakes
//! porters made on Gemma 2 and CLIP (`tests/porters.rs`): Gemma's RMSNorm scaled by `weight`
//! instead of `1 + weight`; the attention's logit soft-capping left out; a sliding window one key
//! wider; the scale `head_dim^-0.5` where the config's `query_pre_attn_scalar^-0.5` differs; the
//! embedding without its `√hidden` scale; the MLP's tanh GELU as the erf one; a sandwich norm
//! skipped; CLIP's quick_gelu as GELU; the class token appended instead of prepended; positions
//! off by one; and the tanh GELU that `NewGELUActivation` writes out, ported as the erf one. Every
//! check is against the real `transformers` class, built from a small configuration, no wrapper.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use golden::{DimExpr, Dist, IntoOutputs, Layer, Outputs, PortInputs};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A port as a check calls it.
pub type Port = Arc<dyn Fn(&PortInputs) -> std::result::Result<Outputs, String> + Send + Sync>;

/// A port, and what the diagnosis of its failure must name: any one of `expected` (the mutation's
/// words and the reference's line), first in the list of causes; empty for a right port.
pub struct PorterPort {
    /// The check (its name is unique across the suites).
    pub layer: Layer,
    /// The port.
    pub port: Port,
    /// (text of the cause, text of its site) pairs, any of which is right.
    pub expected: Vec<(&'static str, &'static str)>,
}

fn port(
    layer: Layer,
    expected: Vec<(&'static str, &'static str)>,
    f: impl Fn(&PortInputs) -> Result<Tensor> + Send + Sync + 'static,
) -> PorterPort {
    PorterPort {
        layer,
        port: Arc::new(move |i| f(i).into_outputs()),
        expected,
    }
}

fn linear(vb: &VarBuilder, out: usize, inp: usize, name: &str, bias: bool) -> Result<Linear> {
    let w = vb.get((out, inp), &format!("{name}.weight"))?;
    let b = if bias {
        Some(vb.get(out, &format!("{name}.bias"))?)
    } else {
        None
    };
    Ok(Linear::new(w, b))
}

// --- Gemma 2 -------------------------------------------------------------------------------------

pub const G_VOCAB: usize = 64;
pub const G_HIDDEN: usize = 16;
const G_INTERMEDIATE: usize = 24;
const G_HEADS: usize = 2;
const G_KV_HEADS: usize = 1;
const G_HEAD_DIM: usize = 8;
/// Not the head size: Gemma 2 scales its scores by `query_pre_attn_scalar^-0.5`.
const G_QUERY_SCALAR: usize = 20;
const G_WINDOW: usize = 3;
const G_SOFTCAP: f64 = 3.0;
const G_EPS: f64 = 1e-6;

/// Gemma2RMSNorm on its own: `x / rms(x) * (1 + weight)`, in float32.
fn gemma_rms_layer(name: &str) -> Layer {
    Layer::module(
        name,
        "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm",
    )
    .init("dim", G_HIDDEN)
    .dim("b", 1, 3)
    .dim("t", 1, 6)
    .arg(
        "x",
        ["b".into(), "t".into(), DimExpr::Lit(G_HIDDEN)],
        Dist::default(),
    )
}

fn gemma_rms(x: &Tensor, weight: &Tensor, one_plus: bool) -> Result<Tensor> {
    let dtype = x.dtype();
    let h = x.to_dtype(DType::F32)?;
    let h = h.broadcast_div(&(h.sqr()?.mean_keepdim(D::Minus1)? + G_EPS)?.sqrt()?)?;
    let w = weight.to_dtype(DType::F32)?;
    let w = if one_plus { (w + 1.0)? } else { w };
    h.broadcast_mul(&w)?.to_dtype(dtype)
}

/// The right Gemma2RMSNorm port.
pub fn gemma_rms_norm_right() -> PorterPort {
    port(gemma_rms_layer("p_gemma_rms_right"), vec![], |i| {
        gemma_rms(i.tensor(0), &i.var_builder().get(G_HIDDEN, "weight")?, true)
    })
}

/// Scaled by `weight`, as Llama's RMSNorm is, where Gemma's is scaled by `1 + weight`.
pub fn gemma_rms_norm_weight_not_one_plus() -> PorterPort {
    port(
        gemma_rms_layer("p_gemma_rms_weight"),
        vec![(
            "`1.0 + self.weight.float()` without its 1",
            "transformers/models/gemma2/modeling_gemma2.py:61",
        )],
        |i| {
            gemma_rms(
                i.tensor(0),
                &i.var_builder().get(G_HIDDEN, "weight")?,
                false,
            )
        },
    )
}

/// The mistakes a port of `Gemma2Model` makes (all false: the right port).
#[derive(Clone, Copy, Default)]
pub struct Gemma {
    /// The attention's logit soft-capping `tanh(s / cap) · cap` left out.
    pub no_softcap: bool,
    /// The sliding window lets one more key in (`kv ≥ q − window`).
    pub window_wider: bool,
    /// Scores scaled by `head_dim^-0.5` instead of `query_pre_attn_scalar^-0.5`.
    pub scale_by_head_dim: bool,
    /// The embedding not multiplied by `√hidden_size`.
    pub no_embedding_scale: bool,
    /// The MLP's tanh GELU (`gelu_pytorch_tanh`) as the erf one.
    pub mlp_gelu_erf: bool,
    /// The norm after the MLP (`post_feedforward_layernorm`) left out.
    pub no_post_feedforward_norm: bool,
}

/// `transformers.Gemma2Model`, two layers (the first with a sliding window, the second full), eager
/// attention, from a `Gemma2Config` small enough to check in seconds; a soft-cap of 3 and weights
/// drawn with a standard deviation of 0.5 (the configuration's `initializer_range`), so that the
/// scores reach it.
pub fn gemma_layer(name: &str) -> Layer {
    Layer::module(name, "transformers.Gemma2Model")
        .config("transformers.Gemma2Config")
        .config_value("vocab_size", G_VOCAB)
        .config_value("hidden_size", G_HIDDEN)
        .config_value("intermediate_size", G_INTERMEDIATE)
        .config_value("num_hidden_layers", 2)
        .config_value("num_attention_heads", G_HEADS)
        .config_value("num_key_value_heads", G_KV_HEADS)
        .config_value("head_dim", G_HEAD_DIM)
        .config_value("query_pre_attn_scalar", G_QUERY_SCALAR)
        .config_value("sliding_window", G_WINDOW)
        .config_value("attn_logit_softcapping", G_SOFTCAP)
        .config_value("max_position_embeddings", 64)
        .config_value("use_cache", false)
        .config_value("attn_implementation", "eager")
        // Weights of a trained model's scale, not of a fresh one's (0.02): scores and MLP inputs
        // of order one, where soft-capping and the GELU's form show.
        .config_value("initializer_range", 0.5)
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg("input_ids", ["b", "t"], Dist::int(0, G_VOCAB as i64))
        .cases(12)
}

/// cos and sin of positions `0..t` for the rotary embedding, `[t, head_dim]`, in float32 as
/// Gemma2RotaryEmbedding computes them (base 10000, the frequencies over both halves).
fn rotary(t: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..G_HEAD_DIM / 2)
        .map(|j| 1.0 / 10000f32.powf((2 * j) as f32 / G_HEAD_DIM as f32))
        .collect();
    let freqs: Vec<f32> = (0..t)
        .flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f))
        .collect();
    let freqs = Tensor::from_vec(freqs, (t, G_HEAD_DIM / 2), device)?;
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
    Ok((emb.cos()?, emb.sin()?))
}

fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let half = G_HEAD_DIM / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// The mask of one layer: 0 where a query may attend a key, the dtype's lowest value elsewhere.
fn gemma_mask(t: usize, sliding: bool, o: Gemma, dtype: DType, device: &Device) -> Result<Tensor> {
    let allowed = |q: usize, k: usize| {
        let causal = k <= q;
        if !sliding {
            return causal;
        }
        let window = if o.window_wider {
            k + G_WINDOW >= q
        } else {
            k + G_WINDOW > q
        };
        causal && window
    };
    let min = match dtype {
        DType::F64 => f64::MIN,
        DType::F16 => -65504.0,
        DType::BF16 => -3.389_531_4e38,
        _ => f32::MIN as f64,
    };
    let values: Vec<f64> = (0..t)
        .flat_map(|q| (0..t).map(move |k| if allowed(q, k) { 0.0 } else { min }))
        .collect();
    Tensor::from_vec(values, (t, t), device)?.to_dtype(dtype)
}

fn gemma_attention(vb: &VarBuilder, x: &Tensor, sliding: bool, o: Gemma) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let dtype = x.dtype();
    let heads = |name: &str, n: usize| -> Result<Tensor> {
        linear(vb, n * G_HEAD_DIM, G_HIDDEN, name, false)?
            .forward(x)?
            .reshape((b, t, n, G_HEAD_DIM))?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (
        heads("q_proj", G_HEADS)?,
        heads("k_proj", G_KV_HEADS)?,
        heads("v_proj", G_KV_HEADS)?,
    );
    let (cos, sin) = rotary(t, x.device())?;
    let (cos, sin) = (cos.to_dtype(dtype)?, sin.to_dtype(dtype)?);
    let rope = |z: &Tensor| -> Result<Tensor> {
        z.broadcast_mul(&cos)?
            .add(&rotate_half(z)?.broadcast_mul(&sin)?)
    };
    let (q, k) = (rope(&q)?, rope(&k)?);
    // Each key/value head serves consecutive query heads (repeat_kv).
    let repeat = |z: Tensor| -> Result<Tensor> {
        z.unsqueeze(2)?
            .expand((b, G_KV_HEADS, G_HEADS / G_KV_HEADS, t, G_HEAD_DIM))?
            .reshape((b, G_HEADS, t, G_HEAD_DIM))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scaling = if o.scale_by_head_dim {
        (G_HEAD_DIM as f64).powf(-0.5)
    } else {
        (G_QUERY_SCALAR as f64).powf(-0.5)
    };
    let mut scores = (q.matmul(&k.t()?)? * scaling)?;
    if !o.no_softcap {
        scores = ((scores / G_SOFTCAP)?.tanh()? * G_SOFTCAP)?;
    }
    let scores = scores.broadcast_add(&gemma_mask(t, sliding, o, dtype, x.device())?)?;
    let probs =
        candle_nn::ops::softmax(&scores.to_dtype(DType::F32)?, D::Minus1)?.to_dtype(dtype)?;
    let y = probs
        .matmul(&v)?
        .transpose(1, 2)?
        .reshape((b, t, G_HEADS * G_HEAD_DIM))?;
    linear(vb, G_HIDDEN, G_HEADS * G_HEAD_DIM, "o_proj", false)?.forward(&y)
}

fn gemma_mlp(vb: &VarBuilder, x: &Tensor, o: Gemma) -> Result<Tensor> {
    let gate = linear(vb, G_INTERMEDIATE, G_HIDDEN, "gate_proj", false)?.forward(x)?;
    let up = linear(vb, G_INTERMEDIATE, G_HIDDEN, "up_proj", false)?.forward(x)?;
    let gate = if o.mlp_gelu_erf {
        gate.gelu_erf()?
    } else {
        gate.gelu()?
    };
    linear(vb, G_HIDDEN, G_INTERMEDIATE, "down_proj", false)?.forward(&(gate * up)?)
}

/// `Gemma2Model`'s last hidden state, as a porter writes it, with the mistakes `o` names.
pub fn gemma_model(vb: VarBuilder, ids: &Tensor, o: Gemma) -> Result<Tensor> {
    let norm = |x: &Tensor, name: &str| -> Result<Tensor> {
        gemma_rms(x, &vb.get(G_HIDDEN, &format!("{name}.weight"))?, true)
    };
    let embedding = candle_nn::Embedding::new(
        vb.get((G_VOCAB, G_HIDDEN), "embed_tokens.weight")?,
        G_HIDDEN,
    );
    let mut x = embedding.forward(ids)?;
    if !o.no_embedding_scale {
        // The normalizer in the embedding's dtype, as Gemma2 computes it.
        let scale = Tensor::new((G_HIDDEN as f32).sqrt(), ids.device())?.to_dtype(x.dtype())?;
        x = x.broadcast_mul(&scale)?;
    }
    for layer in 0..2 {
        let p = format!("layers.{layer}");
        let vb_l = vb.pp(&p);
        let h = norm(&x, &format!("{p}.input_layernorm"))?;
        let h = gemma_attention(&vb_l.pp("self_attn"), &h, layer == 0, o)?;
        let h = norm(&h, &format!("{p}.post_attention_layernorm"))?;
        x = (x + h)?;
        let h = norm(&x, &format!("{p}.pre_feedforward_layernorm"))?;
        let h = gemma_mlp(&vb_l.pp("mlp"), &h, o)?;
        let h = if o.no_post_feedforward_norm {
            h
        } else {
            norm(&h, &format!("{p}.post_feedforward_layernorm"))?
        };
        x = (x + h)?;
    }
    norm(&x, "norm")
}

fn gemma(name: &str, o: Gemma, expected: Vec<(&'static str, &'static str)>) -> PorterPort {
    PorterPort {
        layer: gemma_layer(name),
        port: Arc::new(move |i| {
            gemma_model(i.var_builder(), i.tensor(0), o)
                .map(hidden_state)
                .into_outputs()
        }),
        expected,
    }
}

const MODELING_GEMMA2: &str = "transformers/models/gemma2/modeling_gemma2.py";

/// The right port of Gemma2Model.
pub fn gemma_right() -> PorterPort {
    gemma("p_gemma_right", Gemma::default(), vec![])
}

pub fn gemma_without_soft_capping() -> PorterPort {
    gemma(
        "p_gemma_softcap",
        Gemma {
            no_softcap: true,
            ..Gemma::default()
        },
        vec![
            ("torch.tanh left out", "modeling_gemma2.py:197"),
            (
                "`attn_logit_softcapping` were None",
                "modeling_gemma2.py:237",
            ),
        ],
    )
}

pub fn gemma_sliding_window_one_wider() -> PorterPort {
    gemma(
        "p_gemma_window",
        Gemma {
            window_wider: true,
            ..Gemma::default()
        },
        vec![
            (
                "`kv_idx > q_idx - sliding_window` with >= instead of >",
                "transformers/masking_utils.py:95",
            ),
            (
                "`q_idx - sliding_window` with 4 instead of 3",
                "transformers/masking_utils.py:95",
            ),
            ("`sliding_window` were 4", "modeling_gemma2.py:238"),
        ],
    )
}

pub fn gemma_scaled_by_head_dim() -> PorterPort {
    gemma(
        "p_gemma_scale",
        Gemma {
            scale_by_head_dim: true,
            ..Gemma::default()
        },
        vec![
            (
                "Tensor.mul by 0.353553 = 1/√8 (head_dim = hidden_size/num_attention_heads = 8) \
                 instead of 0.223607 = 1/√query_pre_attn_scalar (query_pre_attn_scalar = 20)",
                "modeling_gemma2.py:193",
            ),
            ("`query_pre_attn_scalar` were 8", "modeling_gemma2.py:221"),
        ],
    )
}

pub fn gemma_embedding_unscaled() -> PorterPort {
    gemma(
        "p_gemma_embed_scale",
        Gemma {
            no_embedding_scale: true,
            ..Gemma::default()
        },
        vec![("without its second operand", "modeling_gemma2.py:341")],
    )
}

pub fn gemma_mlp_with_erf_gelu() -> PorterPort {
    gemma(
        "p_gemma_gelu",
        Gemma {
            mlp_gelu_erf: true,
            ..Gemma::default()
        },
        vec![
            ("F.gelu(approximate='none')", "transformers/activations.py:"),
            ("`hidden_activation` were 'gelu'", "modeling_gemma2.py:77"),
        ],
    )
}

pub fn gemma_without_post_feedforward_norm() -> PorterPort {
    gemma(
        "p_gemma_post_ff_norm",
        Gemma {
            no_post_feedforward_norm: true,
            ..Gemma::default()
        },
        vec![(
            "`layers.*.post_feedforward_layernorm` (Gemma2RMSNorm) skipped",
            MODELING_GEMMA2,
        )],
    )
}

// --- CLIP ----------------------------------------------------------------------------------------

const C_HIDDEN: usize = 16;
const C_INTERMEDIATE: usize = 24;
const C_IMAGE: usize = 8;
const C_PATCH: usize = 4;
const C_CHANNELS: usize = 3;
const C_VOCAB: usize = 50;
const C_POSITIONS: usize = 16;

fn clip_vision(name: &str, reference: &str) -> Layer {
    Layer::module(name, reference)
        .config("transformers.CLIPVisionConfig")
        .config_value("hidden_size", C_HIDDEN)
        .config_value("intermediate_size", C_INTERMEDIATE)
        .config_value("num_attention_heads", 2)
        .config_value("image_size", C_IMAGE)
        .config_value("patch_size", C_PATCH)
        .config_value("num_channels", C_CHANNELS)
        .config_value("hidden_act", "quick_gelu")
}

fn clip_mlp_layer(name: &str) -> Layer {
    clip_vision(name, "transformers.models.clip.modeling_clip.CLIPMLP")
        .dim("b", 1, 2)
        .dim("t", 1, 6)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(C_HIDDEN)],
            Dist::normal(0.0, 2.0),
        )
}

fn clip_mlp(i: &PortInputs, quick: bool) -> Result<Tensor> {
    let vb = i.var_builder();
    let h = linear(&vb, C_INTERMEDIATE, C_HIDDEN, "fc1", true)?.forward(i.tensor(0))?;
    let h = if quick {
        (&h * candle_nn::ops::sigmoid(&(&h * 1.702)?)?)?
    } else {
        h.gelu_erf()?
    };
    linear(&vb, C_HIDDEN, C_INTERMEDIATE, "fc2", true)?.forward(&h)
}

pub fn clip_mlp_right() -> PorterPort {
    port(clip_mlp_layer("p_clip_mlp_right"), vec![], |i| {
        clip_mlp(i, true)
    })
}

/// CLIP's `quick_gelu` (`x · sigmoid(1.702 x)`) ported as GELU.
pub fn clip_mlp_with_gelu() -> PorterPort {
    port(
        clip_mlp_layer("p_clip_mlp_gelu"),
        vec![
            (
                "GELU (erf) in place of the quick_gelu (x·sigmoid(1.702·x)) the reference writes out",
                "transformers/activations.py:123",
            ),
            ("`hidden_act` were 'gelu'", "modeling_clip.py:342"),
        ],
        |i| clip_mlp(i, false),
    )
}

fn clip_embeddings_layer(name: &str) -> Layer {
    clip_vision(
        name,
        "transformers.models.clip.modeling_clip.CLIPVisionEmbeddings",
    )
    .dim("b", 1, 3)
    .arg(
        "pixel_values",
        [
            "b".into(),
            DimExpr::Lit(C_CHANNELS),
            DimExpr::Lit(C_IMAGE),
            DimExpr::Lit(C_IMAGE),
        ],
        Dist::default(),
    )
}

fn clip_embeddings(i: &PortInputs, class_first: bool) -> Result<Tensor> {
    let vb = i.var_builder();
    let px = i.tensor(0);
    let b = px.dim(0)?;
    let w = vb.get(
        (C_HIDDEN, C_CHANNELS, C_PATCH, C_PATCH),
        "patch_embedding.weight",
    )?;
    let patches = px
        .conv2d(&w, 0, C_PATCH, 1, 1)?
        .flatten_from(2)?
        .transpose(1, 2)?;
    let class = vb
        .get(C_HIDDEN, "class_embedding")?
        .reshape((1, 1, C_HIDDEN))?
        .broadcast_as((b, 1, C_HIDDEN))?;
    let tokens = if class_first {
        Tensor::cat(&[&class, &patches], 1)?
    } else {
        Tensor::cat(&[&patches, &class], 1)?
    };
    let n = (C_IMAGE / C_PATCH).pow(2) + 1;
    let positions = vb.get((n, C_HIDDEN), "position_embedding.weight")?;
    tokens.broadcast_add(&positions.unsqueeze(0)?)
}

pub fn clip_embeddings_right() -> PorterPort {
    port(clip_embeddings_layer("p_clip_embed_right"), vec![], |i| {
        clip_embeddings(i, true)
    })
}

/// The class token appended after the patches where CLIP puts it first.
pub fn clip_class_token_appended() -> PorterPort {
    port(
        clip_embeddings_layer("p_clip_class_last"),
        vec![(
            "`torch.cat([class_embeds, patch_embeds], dim=1)` with its two tensors in the other order",
            "transformers/models/clip/modeling_clip.py:213",
        )],
        |i| clip_embeddings(i, false),
    )
}

fn clip_text_layer(name: &str) -> Layer {
    Layer::module(
        name,
        "transformers.models.clip.modeling_clip.CLIPTextEmbeddings",
    )
    .config("transformers.CLIPTextConfig")
    .config_value("vocab_size", C_VOCAB)
    .config_value("hidden_size", C_HIDDEN)
    .config_value("intermediate_size", C_INTERMEDIATE)
    .config_value("num_attention_heads", 2)
    .config_value("max_position_embeddings", C_POSITIONS)
    .config_value("bos_token_id", 0)
    .config_value("eos_token_id", 1)
    .config_value("pad_token_id", 1)
    .dim("b", 1, 2)
    .dim("t", 1, 12)
    .arg("input_ids", ["b", "t"], Dist::int(0, C_VOCAB as i64))
}

fn clip_text(i: &PortInputs, first_position: u32) -> Result<Tensor> {
    let vb = i.var_builder();
    let ids = i.tensor(0);
    let t = ids.dim(1)?;
    let tokens = candle_nn::Embedding::new(
        vb.get((C_VOCAB, C_HIDDEN), "token_embedding.weight")?,
        C_HIDDEN,
    )
    .forward(ids)?;
    let positions = Tensor::arange(first_position, first_position + t as u32, ids.device())?;
    let positions = candle_nn::Embedding::new(
        vb.get((C_POSITIONS, C_HIDDEN), "position_embedding.weight")?,
        C_HIDDEN,
    )
    .forward(&positions)?;
    tokens.broadcast_add(&positions.unsqueeze(0)?)
}

pub fn clip_text_right() -> PorterPort {
    port(clip_text_layer("p_clip_text_right"), vec![], |i| {
        clip_text(i, 0)
    })
}

/// Positions counted from 1 (as models with a padding offset do) where CLIP counts from 0.
pub fn clip_positions_off_by_one() -> PorterPort {
    port(
        clip_text_layer("p_clip_positions"),
        vec![
            (
                "`self.position_ids[:, :seq_length]` with the slice [1:",
                "transformers/models/clip/modeling_clip.py:248",
            ),
            (
                "torch.arange(1, ",
                "transformers/models/clip/modeling_clip.py:230",
            ),
        ],
        |i| clip_text(i, 1),
    )
}

// --- NewGELUActivation ---------------------------------------------------------------------------

fn new_gelu_layer(name: &str) -> Layer {
    Layer::module(name, "transformers.activations.NewGELUActivation")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::normal(0.0, 2.0))
}

pub fn new_gelu_right() -> PorterPort {
    port(new_gelu_layer("p_new_gelu_right"), vec![], |i| {
        i.tensor(0).gelu()
    })
}

/// GPT-2's GELU, written out with tanh in `NewGELUActivation`, ported as the erf GELU.
pub fn new_gelu_as_erf() -> PorterPort {
    port(
        new_gelu_layer("p_new_gelu_erf"),
        vec![(
            "GELU (erf) in place of the GELU (tanh approximation) the reference writes out",
            "transformers/activations.py:66",
        )],
        |i| i.tensor(0).gelu_erf(),
    )
}

/// The wrong ports, by test name.
pub fn wrong() -> Vec<(&'static str, PorterPort)> {
    macro_rules! ports {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), $name())),*] };
    }
    ports![
        gemma_rms_norm_weight_not_one_plus,
        gemma_without_soft_capping,
        gemma_sliding_window_one_wider,
        gemma_scaled_by_head_dim,
        gemma_embedding_unscaled,
        gemma_mlp_with_erf_gelu,
        gemma_without_post_feedforward_norm,
        clip_mlp_with_gelu,
        clip_class_token_appended,
        clip_positions_off_by_one,
        new_gelu_as_erf,
    ]
}

/// The right ports.
pub fn right() -> Vec<PorterPort> {
    vec![
        gemma_rms_norm_right(),
        gemma_right(),
        clip_mlp_right(),
        clip_embeddings_right(),
        clip_text_right(),
        new_gelu_right(),
    ]
}

/// The dict a Hugging Face model returns, as the port's outputs: `last_hidden_state`.
pub fn hidden_state(t: Tensor) -> BTreeMap<&'static str, Tensor> {
    BTreeMap::from([("last_hidden_state", t)])
}
