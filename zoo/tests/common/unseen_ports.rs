//! Ports written after the operator-level mutation families were done, of modules and mistakes
//! golden's diagnosis was never tuned to (`tests/unseen.rs` measures what it names on them, and
//! keeps what it says as the tests' expectations, misses included). Each is a candle port of a
//! real `transformers` (or torch) module, right, or with one mistake a porter makes:
//!
//! 1. T5's relative attention bias from `query − key` instead of `key − query`;
//! 2. T5's attention scores scaled by 1/√d_kv (T5 does not scale them);
//! 3. BERT's pooler on the last token instead of the first;
//! 4. BERT's self-output normalising the dense output before the residual add;
//! 5. GPT-2's `Conv1D` weight used as a Linear's (`x @ Wᵀ`, square sizes);
//! 6. Whisper's sinusoidal positions with cos before sin;
//! 7. a GroupNorm computed over one group instead of four;
//! 8. a BatchNorm in eval mode normalising with the batch's statistics;
//! 9. ViT's patches flattened column by column;
//! 10. wav2vec2's same-padding layer dropping the first frame instead of the last;
//! 11. a transposed convolution cropped on one side only;
//! 12. BART's learned positions without their offset of 2;
//! 13. T5's layer norm subtracting the mean (a LayerNorm, not an RMS norm).

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use golden::{DimExpr, Dist, IntoOutputs, Layer, Outputs, PortInputs, Value};
use std::sync::Arc;

/// A port as a check calls it.
pub type Port = Arc<dyn Fn(&PortInputs) -> std::result::Result<Outputs, String> + Send + Sync>;

/// A check and its port (right when `bug` is false).
pub struct Unseen {
    /// The check.
    pub layer: Layer,
    /// The port.
    pub port: Port,
}

fn unseen<O: IntoOutputs>(
    layer: Layer,
    f: impl Fn(&PortInputs) -> Result<O> + Send + Sync + 'static,
) -> Unseen {
    Unseen {
        layer,
        port: Arc::new(move |i| f(i).into_outputs()),
    }
}

fn name(base: &str, bug: bool) -> String {
    format!("u_{base}{}", if bug { "" } else { "_right" })
}

fn lin(vb: &VarBuilder, out: usize, inp: usize, name: &str, bias: bool) -> Result<Linear> {
    let w = vb.get((out, inp), &format!("{name}.weight"))?;
    let b = if bias {
        Some(vb.get(out, &format!("{name}.bias"))?)
    } else {
        None
    };
    Ok(Linear::new(w, b))
}

fn hidden(b: &str, t: &str, d: usize) -> [DimExpr; 3] {
    [b.into(), t.into(), DimExpr::Lit(d)]
}

// --- T5 attention with its relative position bias ------------------------------------------------

const T5_D: usize = 16;
const T5_HEADS: usize = 2;
const T5_DKV: usize = 8;
const T5_BUCKETS: usize = 32;

fn t5_attention_layer(name: &str) -> Layer {
    Layer::module(name, "transformers.models.t5.modeling_t5.T5Attention")
        .config("transformers.T5Config")
        .config_value("d_model", T5_D)
        .config_value("d_kv", T5_DKV)
        .config_value("num_heads", T5_HEADS)
        .config_value("relative_attention_num_buckets", T5_BUCKETS)
        .config_value("is_decoder", false)
        .config_value("attn_implementation", "eager")
        .init("has_relative_attention_bias", true)
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg("hidden_states", hidden("b", "t", T5_D), Dist::default())
}

/// The bucket of a relative position (`key − query` in T5), bidirectional, for |rel| < 8 (the
/// exact buckets: these sequences are no longer).
fn t5_bucket(rel: i64) -> u32 {
    let half = (T5_BUCKETS / 2) as i64;
    (if rel > 0 { half } else { 0 } + rel.abs()) as u32
}

fn t5_attention(i: &PortInputs, sign_flipped: bool, scaled: bool) -> Result<Vec<Tensor>> {
    let vb = i.var_builder();
    let x = i.tensor(0);
    let (b, t, _) = x.dims3()?;
    let heads = |name: &str| -> Result<Tensor> {
        lin(&vb, T5_HEADS * T5_DKV, T5_D, name, false)?
            .forward(x)?
            .reshape((b, t, T5_HEADS, T5_DKV))?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (heads("q")?, heads("k")?, heads("v")?);
    let mut scores = q.matmul(&k.t()?)?;
    if scaled {
        scores = (scores / (T5_DKV as f64).sqrt())?;
    }
    let buckets: Vec<u32> = (0..t as i64)
        .flat_map(|q| {
            (0..t as i64).map(move |k| t5_bucket(if sign_flipped { q - k } else { k - q }))
        })
        .collect();
    let buckets = Tensor::from_vec(buckets, (t, t), x.device())?;
    let table = vb.get((T5_BUCKETS, T5_HEADS), "relative_attention_bias.weight")?;
    let bias = candle_nn::Embedding::new(table, T5_HEADS)
        .forward(&buckets)?
        .permute((2, 0, 1))?
        .unsqueeze(0)?
        .contiguous()?;
    let weights = candle_nn::ops::softmax(&scores.broadcast_add(&bias)?, D::Minus1)?;
    let y = weights
        .matmul(&v)?
        .transpose(1, 2)?
        .reshape((b, t, T5_HEADS * T5_DKV))?;
    let out = lin(&vb, T5_D, T5_HEADS * T5_DKV, "o", false)?.forward(&y)?;
    Ok(vec![out, bias, weights])
}

/// Mistake 1: the relative position as `query − key`.
pub fn t5_relative_position_sign_flipped(bug: bool) -> Unseen {
    unseen(t5_attention_layer(&name("t5_rel_sign", bug)), move |i| {
        t5_attention(i, bug, false)
    })
}

/// Mistake 2: scores scaled by 1/√d_kv, as most attentions do and T5's does not.
pub fn t5_scores_scaled(bug: bool) -> Unseen {
    unseen(t5_attention_layer(&name("t5_scaled", bug)), move |i| {
        t5_attention(i, false, bug)
    })
}

// --- BERT ----------------------------------------------------------------------------------------

const B_D: usize = 16;

fn bert(name: &str, class: &str) -> Layer {
    Layer::module(
        name,
        &format!("transformers.models.bert.modeling_bert.{class}"),
    )
    .config("transformers.BertConfig")
    .config_value("hidden_size", B_D)
    .config_value("num_attention_heads", 2)
    .config_value("intermediate_size", 32)
    .dim("b", 1, 3)
    .dim("t", 1, 6)
}

/// Mistake 3: the pooled token is the last one; BERT pools the first (`[CLS]`).
pub fn bert_pooler_last_token(bug: bool) -> Unseen {
    let layer = bert(&name("bert_pooler", bug), "BertPooler").arg(
        "hidden_states",
        hidden("b", "t", B_D),
        Dist::default(),
    );
    unseen(layer, move |i| {
        let x = i.tensor(0);
        let t = x.dim(1)?;
        let token = x.narrow(1, if bug { t - 1 } else { 0 }, 1)?.squeeze(1)?;
        lin(&i.var_builder(), B_D, B_D, "dense", true)?
            .forward(&token)?
            .tanh()
    })
}

fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    centered
        .broadcast_div(&(var + eps)?.sqrt()?)?
        .broadcast_mul(w)?
        .broadcast_add(b)
}

/// Mistake 4: the dense output normalised before the residual add; BERT normalises the sum.
pub fn bert_self_output_norm_before_residual(bug: bool) -> Unseen {
    let layer = bert(&name("bert_self_output", bug), "BertSelfOutput")
        .arg("hidden_states", hidden("b", "t", B_D), Dist::default())
        .arg("input_tensor", hidden("b", "t", B_D), Dist::default());
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let h = lin(&vb, B_D, B_D, "dense", true)?.forward(i.tensor(0))?;
        let (w, b) = (
            vb.get(B_D, "LayerNorm.weight")?,
            vb.get(B_D, "LayerNorm.bias")?,
        );
        if bug {
            layer_norm(&h, &w, &b, 1e-12)? + i.tensor(1)
        } else {
            layer_norm(&(h + i.tensor(1))?, &w, &b, 1e-12)
        }
    })
}

// --- GPT-2's Conv1D ------------------------------------------------------------------------------

const G2_D: usize = 16;

/// Mistake 5: gPT-2's MLP, whose `Conv1D` keeps its weight as [in, out] (`x @ W + b`), ported with a
/// Linear's convention (`x @ Wᵀ`); square, so that it runs.
pub fn gpt2_conv1d_weight_as_linear(bug: bool) -> Unseen {
    let layer = Layer::module(
        &name("gpt2_mlp", bug),
        "transformers.models.gpt2.modeling_gpt2.GPT2MLP",
    )
    .config("transformers.GPT2Config")
    .config_value("n_embd", G2_D)
    .config_value("n_head", 2)
    .init("intermediate_size", G2_D)
    .dim("b", 1, 2)
    .dim("t", 1, 6)
    .arg("hidden_states", hidden("b", "t", G2_D), Dist::default());
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let conv = |x: &Tensor, name: &str| -> Result<Tensor> {
            let w = vb.get((G2_D, G2_D), &format!("{name}.weight"))?;
            let w = if bug { w.t()? } else { w };
            x.broadcast_matmul(&w)?
                .broadcast_add(&vb.get(G2_D, &format!("{name}.bias"))?)
        };
        conv(&conv(i.tensor(0), "c_fc")?.gelu()?, "c_proj")
    })
}

// --- Whisper's sinusoids -------------------------------------------------------------------------

const W_CHANNELS: usize = 8;

/// Mistake 6: whisper's sinusoidal positions (`sinusoids(length, channels)`: sin then cos), cos first.
pub fn whisper_sinusoids_cos_first(bug: bool) -> Unseen {
    let layer = Layer::function(
        &name("whisper_sinusoids", bug),
        "transformers.models.whisper.modeling_whisper.sinusoids",
    )
    .dim("l", 1, 12)
    .konst("length", Value::dim("l"))
    .konst("channels", W_CHANNELS);
    unseen(layer, move |i| {
        let l = i.dim("l");
        let half = W_CHANNELS / 2;
        let step = (10000f64).ln() / (half - 1) as f64;
        let inv: Vec<f32> = (0..half).map(|k| (-step * k as f64).exp() as f32).collect();
        let times: Vec<f32> = (0..l)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let scaled = Tensor::from_vec(times, (l, half), &candle_core::Device::Cpu)?;
        let (sin, cos) = (scaled.sin()?, scaled.cos()?);
        if bug {
            Tensor::cat(&[&cos, &sin], 1)
        } else {
            Tensor::cat(&[&sin, &cos], 1)
        }
    })
}

// --- torch's norms -------------------------------------------------------------------------------

const N_C: usize = 8;

fn channels_layer(name: &str, reference: &str) -> Layer {
    Layer::module(name, reference)
        .dim("b", 1, 3)
        .dim("t", 1, 6)
        .arg(
            "input",
            ["b".into(), DimExpr::Lit(N_C), "t".into()],
            Dist::default(),
        )
}

/// Mistake 7: a GroupNorm of 4 groups computed over one group (all channels together).
pub fn group_norm_one_group(bug: bool) -> Unseen {
    let layer = channels_layer(&name("group_norm", bug), "torch.nn.GroupNorm")
        .init("num_groups", 4)
        .init("num_channels", N_C);
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let x = i.tensor(0);
        let (b, c, t) = x.dims3()?;
        let groups = if bug { 1 } else { 4 };
        let g = x.reshape((b, groups, c / groups * t))?;
        let centered = g.broadcast_sub(&g.mean_keepdim(D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered
            .broadcast_div(&(var + 1e-5)?.sqrt()?)?
            .reshape((b, c, t))?;
        normed
            .broadcast_mul(&vb.get(N_C, "weight")?.reshape((1, N_C, 1))?)?
            .broadcast_add(&vb.get(N_C, "bias")?.reshape((1, N_C, 1))?)
    })
}

/// Mistake 8: a BatchNorm in eval mode normalised with the batch's own statistics (training mode's).
pub fn batch_norm_batch_statistics(bug: bool) -> Unseen {
    let layer = channels_layer(&name("batch_norm", bug), "torch.nn.BatchNorm1d")
        .init("num_features", N_C)
        .dim("b", 2, 3)
        .dim("t", 2, 6);
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let x = i.tensor(0);
        let per_channel = |t: Tensor| t.reshape((1, N_C, 1));
        let (mean, var) = if bug {
            let m = x.mean_keepdim(2)?.mean_keepdim(0)?;
            let v = x
                .broadcast_sub(&m)?
                .sqr()?
                .mean_keepdim(2)?
                .mean_keepdim(0)?;
            (m, v)
        } else {
            (
                per_channel(vb.get(N_C, "running_mean")?)?,
                per_channel(vb.get(N_C, "running_var")?)?,
            )
        };
        x.broadcast_sub(&mean)?
            .broadcast_div(&(var + 1e-5)?.sqrt()?)?
            .broadcast_mul(&per_channel(vb.get(N_C, "weight")?)?)?
            .broadcast_add(&per_channel(vb.get(N_C, "bias")?)?)
    })
}

// --- ViT's patches -------------------------------------------------------------------------------

const V_IMAGE: usize = 8;
const V_PATCH: usize = 4;
const V_D: usize = 16;

/// Mistake 9: viT's patch embeddings flattened column by column; ViT goes row by row.
pub fn vit_patches_column_major(bug: bool) -> Unseen {
    let layer = Layer::module(
        &name("vit_patches", bug),
        "transformers.models.vit.modeling_vit.ViTPatchEmbeddings",
    )
    .config("transformers.ViTConfig")
    .config_value("image_size", V_IMAGE)
    .config_value("patch_size", V_PATCH)
    .config_value("num_channels", 3)
    .config_value("hidden_size", V_D)
    .config_value("num_attention_heads", 2)
    .dim("b", 1, 3)
    .arg(
        "pixel_values",
        [
            "b".into(),
            DimExpr::Lit(3),
            DimExpr::Lit(V_IMAGE),
            DimExpr::Lit(V_IMAGE),
        ],
        Dist::default(),
    );
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let w = vb.get((V_D, 3, V_PATCH, V_PATCH), "projection.weight")?;
        let b = vb.get(V_D, "projection.bias")?.reshape((1, V_D, 1, 1))?;
        let y = i
            .tensor(0)
            .conv2d(&w, 0, V_PATCH, 1, 1)?
            .broadcast_add(&b)?;
        let y = if bug { y.transpose(2, 3)? } else { y };
        y.flatten_from(2)?.transpose(1, 2)
    })
}

// --- wav2vec2's same padding ---------------------------------------------------------------------

/// Mistake 10: wav2vec2's `Wav2Vec2SamePadLayer` (an even kernel: one frame too many) dropping the first
/// frame; it drops the last.
pub fn wav2vec2_pad_removed_from_the_front(bug: bool) -> Unseen {
    let layer = Layer::module(
        &name("wav2vec2_same_pad", bug),
        "transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2SamePadLayer",
    )
    .init("num_conv_pos_embeddings", 4)
    .dim("b", 1, 2)
    .dim("c", 1, 4)
    .dim("t", 2, 10)
    .arg("hidden_states", ["b", "c", "t"], Dist::default());
    unseen(layer, move |i| {
        let x = i.tensor(0);
        let t = x.dim(2)?;
        x.narrow(2, usize::from(bug), t - 1)
    })
}

// --- a transposed convolution --------------------------------------------------------------------

/// Mistake 11: `ConvTranspose1d(4, 4, 4, stride=2, padding=1)` computed unpadded and cropped by two frames
/// at the start, where padding 1 crops one at each end.
pub fn conv_transpose_cropped_on_one_side(bug: bool) -> Unseen {
    let layer = Layer::module(&name("conv_transpose", bug), "torch.nn.ConvTranspose1d")
        .init("in_channels", 4)
        .init("out_channels", 4)
        .init("kernel_size", 4)
        .init("stride", 2)
        .init("padding", 1)
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg(
            "input",
            ["b".into(), DimExpr::Lit(4), "t".into()],
            Dist::default(),
        );
    unseen(layer, move |i| {
        let vb = i.var_builder();
        let w = vb.get((4, 4, 4), "weight")?;
        let bias = vb.get(4, "bias")?.reshape((1, 4, 1))?;
        let full = conv_transpose_unpadded(i.tensor(0), &w, 2)?;
        let n = full.dim(2)? - 2;
        let y = full.narrow(2, if bug { 2 } else { 1 }, n)?;
        y.broadcast_add(&bias)
    })
}

/// A transposed convolution without padding, written out: each input frame `i` adds
/// `Σ_c x[c, i] · w[c, :, k]` at output frame `stride · i + k`. (candle 0.11.1's own
/// `conv_transpose1d` with a stride of 2 does not agree with PyTorch's here.)
fn conv_transpose_unpadded(x: &Tensor, w: &Tensor, stride: usize) -> Result<Tensor> {
    let (b, _, t) = x.dims3()?;
    let (_, o, k) = w.dims3()?;
    let length = (t - 1) * stride + k;
    let xt = x.transpose(1, 2)?.contiguous()?; // [b, t, c]
    let mut out = Tensor::zeros((b, o, length), x.dtype(), x.device())?;
    for j in 0..k {
        let wj = w.narrow(2, j, 1)?.squeeze(2)?.contiguous()?; // [c, o]
        let frames = xt.broadcast_matmul(&wj)?.transpose(1, 2)?; // [b, o, t]
                                                                 // Frame i goes to stride · i + j: interleave with stride − 1 zeros, then shift by j.
        let spread = Tensor::cat(
            &[
                frames.unsqueeze(3)?,
                Tensor::zeros((b, o, t, stride - 1), x.dtype(), x.device())?,
            ],
            3,
        )?
        .reshape((b, o, t * stride))?
        .narrow(2, 0, (t - 1) * stride + 1)?;
        out = (out + spread.pad_with_zeros(2, j, length - j - ((t - 1) * stride + 1))?)?;
    }
    Ok(out)
}

// --- BART's learned positions --------------------------------------------------------------------

const P_POSITIONS: usize = 20;

/// Mistake 12: bART's learned positions read at `position` where BART reads `position + 2`.
pub fn bart_positions_without_offset(bug: bool) -> Unseen {
    let layer = Layer::module(
        &name("bart_positions", bug),
        "transformers.models.bart.modeling_bart.BartLearnedPositionalEmbedding",
    )
    .init("num_embeddings", P_POSITIONS)
    .init("embedding_dim", 8)
    .dim("b", 1, 2)
    .dim("t", 1, 10)
    .arg("input_ids", ["b", "t"], Dist::int(0, 50));
    unseen(layer, move |i| {
        let ids = i.tensor(0);
        let (b, t) = ids.dims2()?;
        let offset = if bug { 0 } else { 2 };
        let positions = Tensor::arange(offset, offset + t as u32, ids.device())?;
        let table = i.var_builder().get((P_POSITIONS + 2, 8), "weight")?;
        candle_nn::Embedding::new(table, 8)
            .forward(&positions)?
            .unsqueeze(0)?
            .broadcast_as((b, t, 8))?
            .contiguous()
    })
}

// --- T5's layer norm -----------------------------------------------------------------------------

/// Mistake 13: t5's RMS layer norm ported as a LayerNorm without bias: the mean subtracted first.
pub fn t5_layer_norm_subtracts_the_mean(bug: bool) -> Unseen {
    let layer = Layer::module(
        &name("t5_layer_norm", bug),
        "transformers.models.t5.modeling_t5.T5LayerNorm",
    )
    .init("hidden_size", 16)
    .dim("b", 1, 3)
    .dim("t", 1, 6)
    .arg(
        "hidden_states",
        hidden("b", "t", 16),
        Dist::normal(0.5, 1.0),
    );
    unseen(layer, move |i| {
        let x = i.tensor(0);
        let x = if bug {
            x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?
        } else {
            x.clone()
        };
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(var + 1e-6)?.sqrt()?)?
            .broadcast_mul(&i.var_builder().get(16, "weight")?)
    })
}

/// Every port, wrong (`true`) or right, by test name.
pub fn all(bug: bool) -> Vec<(&'static str, Unseen)> {
    macro_rules! ports {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), $name(bug))),*] };
    }
    ports![
        t5_relative_position_sign_flipped,
        t5_scores_scaled,
        bert_pooler_last_token,
        bert_self_output_norm_before_residual,
        gpt2_conv1d_weight_as_linear,
        whisper_sinusoids_cos_first,
        group_norm_one_group,
        batch_norm_batch_statistics,
        vit_patches_column_major,
        wav2vec2_pad_removed_from_the_front,
        conv_transpose_cropped_on_one_side,
        bart_positions_without_offset,
        t5_layer_norm_subtracts_the_mean,
    ]
}

/// What naming each mistake means for `cargo xtask bench-mutations`: a cause at the line the
/// porter got wrong (any cause text where golden names none, so that only the line counts).
pub fn the_mistake(test: &str) -> Vec<(&'static str, &'static str)> {
    vec![match test {
        "t5_relative_position_sign_flipped" => ("", "transformers/models/t5/modeling_t5.py:271"),
        "t5_scores_scaled" => ("", "transformers/models/t5/modeling_t5.py:159"),
        "bert_pooler_last_token" => (
            "`hidden_states[:, 0]` with index -1 instead of 0",
            "transformers/models/bert/modeling_bert.py:460",
        ),
        "bert_self_output_norm_before_residual" => {
            ("", "transformers/models/bert/modeling_bert.py:292")
        }
        "gpt2_conv1d_weight_as_linear" => (
            "torch.addmm with its second operand transposed",
            "transformers/pytorch_utils.py:119",
        ),
        "whisper_sinusoids_cos_first" => (
            "with its two tensors in the other order",
            "transformers/models/whisper/modeling_whisper.py:65",
        ),
        "group_norm_one_group" => ("", "torch/nn/modules/normalization.py"),
        "batch_norm_batch_statistics" => ("", "torch/nn/modules/batchnorm.py"),
        "vit_patches_column_major" => ("", "transformers/models/vit/modeling_vit.py:69"),
        "wav2vec2_pad_removed_from_the_front" => {
            ("", "transformers/models/wav2vec2/modeling_wav2vec2.py:382")
        }
        "conv_transpose_cropped_on_one_side" => ("", "torch/nn/modules/conv.py"),
        "bart_positions_without_offset" => (
            "`position_ids + self.offset` without its 2",
            "transformers/models/bart/modeling_bart.py:98",
        ),
        "t5_layer_norm_subtracts_the_mean" => ("", "transformers/models/t5/modeling_t5.py:65"),
        other => panic!("no mistake listed for `{other}`"),
    }]
}
