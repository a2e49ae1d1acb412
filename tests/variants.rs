//! Every known variant shipped in `reference_py/zoo_ref/variants.py`, demonstrated on a
//! deliberately wrong port: golden must report that the port matches exactly that variant. Live
//! only: variants are evaluated by the Python worker.

mod common;

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{linear, linear_no_bias, VarBuilder};
use golden::describe::env::Mode;
use golden::{DimExpr, Dist, Layer, PortInputs};
use golden_zoo::blocks::{CausalSelfAttention, Mlp, Norm};

/// The port must fail and be recognised as the variant `name`, the best fit of those that match.
/// (Close variants can fit the same case: eps 1e-6 and 1e-12 on unit-variance inputs.)
fn expect_variant(
    layer: Layer,
    name: &str,
    port: impl Fn(&PortInputs) -> Result<Tensor> + Clone + Send + Sync + 'static,
) {
    let failure = common::must_fail(&layer.mode(Mode::Live), port);
    let msg = failure.to_string();
    let c = failure.case_failure().unwrap_or_else(|| panic!("{msg}"));
    let found: Vec<&str> = c.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(found.first(), Some(&name), "{msg}");
    assert!(
        msg.contains(&format!(
            "the port matches `{name}`, a known variant of the reference"
        )),
        "{msg}"
    );
}

fn unary(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
}

#[test]
fn gelu_tanh_for_erf() {
    expect_variant(
        unary("v_gelu_tanh", "zoo_ref.gelu"),
        "gelu(approximate='tanh')",
        |i| i.tensor(0).gelu(),
    );
}

#[test]
fn gelu_erf_for_tanh() {
    expect_variant(
        unary("v_gelu_erf", "zoo_ref.gelu_tanh"),
        "gelu (exact erf form)",
        |i| i.tensor(0).gelu_erf(),
    );
}

#[test]
fn silu_without_the_x() {
    expect_variant(unary("v_silu_sigmoid", "zoo_ref.silu"), "sigmoid(x)", |i| {
        candle_nn::ops::sigmoid(i.tensor(0))
    });
}

#[test]
fn gelu_for_silu() {
    expect_variant(unary("v_silu_gelu", "zoo_ref.silu"), "gelu", |i| {
        i.tensor(0).gelu_erf()
    });
}

fn softmax_layer(name: &str, rank: usize) -> Layer {
    let axes = ["a", "b", "t", "n"];
    let mut layer = Layer::function(name, "zoo_ref.softmax");
    for axis in &axes[4 - rank..] {
        layer = layer.dim(axis, 2, 6);
    }
    layer.arg("x", axes[4 - rank..].to_vec(), Dist::default())
}

#[test]
fn softmax_over_dim_0() {
    expect_variant(softmax_layer("v_softmax_0", 3), "softmax(dim=0)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 0)
    });
}

#[test]
fn softmax_over_dim_1() {
    expect_variant(softmax_layer("v_softmax_1", 3), "softmax(dim=1)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 1)
    });
}

#[test]
fn softmax_over_dim_2_of_four() {
    expect_variant(softmax_layer("v_softmax_2", 4), "softmax(dim=2)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 2)
    });
}

#[test]
fn log_softmax_for_softmax() {
    expect_variant(softmax_layer("v_log_softmax", 3), "log_softmax", |i| {
        candle_nn::ops::log_softmax(i.tensor(0), D::Minus1)
    });
}

fn layer_norm(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.layer_norm")
        .dim("b", 1, 4)
        .dim("d", 2, 32)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .arg("bias", ["d"], Dist::normal(0.0, 0.1))
        .konst("eps", 1e-5)
}

/// A layer norm port with a configurable mistake.
fn norm_port(i: &PortInputs, eps: f64, unbiased: bool, eps_outside: bool) -> Result<Tensor> {
    let x = i.tensor(0);
    let d = x.dim(D::Minus1)? as f64;
    let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let mut var = centered.sqr()?.sum_keepdim(D::Minus1)?;
    var = (var / if unbiased { d - 1.0 } else { d })?;
    let denominator = if eps_outside {
        (var.sqrt()? + eps)?
    } else {
        (var + eps)?.sqrt()?
    };
    centered
        .broadcast_div(&denominator)?
        .broadcast_mul(i.tensor(1))?
        .broadcast_add(i.tensor(2))
}

#[test]
fn layer_norm_eps_1e3() {
    expect_variant(layer_norm("v_ln_eps_1e3"), "layer_norm(eps=0.001)", |i| {
        norm_port(i, 1e-3, false, false)
    });
}

#[test]
fn layer_norm_eps_1e6() {
    expect_variant(layer_norm("v_ln_eps_1e6"), "layer_norm(eps=1e-06)", |i| {
        norm_port(i, 1e-6, false, false)
    });
}

#[test]
fn layer_norm_eps_1e12() {
    expect_variant(layer_norm("v_ln_eps_1e12"), "layer_norm(eps=1e-12)", |i| {
        norm_port(i, 1e-12, false, false)
    });
}

#[test]
fn layer_norm_unbiased_variance() {
    expect_variant(
        layer_norm("v_ln_unbiased"),
        "unbiased variance (N-1)",
        |i| norm_port(i, 1e-5, true, false),
    );
}

#[test]
fn layer_norm_eps_outside_the_sqrt() {
    expect_variant(
        layer_norm("v_ln_eps_outside"),
        "eps outside the square root",
        |i| norm_port(i, 1e-5, false, true),
    );
}

fn rms_norm(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.rms_norm")
        .dim("b", 1, 4)
        .dim("d", 2, 32)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .konst("eps", 1e-6)
}

fn rms_port(i: &PortInputs, eps: f64, centered: bool, one_plus: bool) -> Result<Tensor> {
    let mut x = i.tensor(0).clone();
    if centered {
        x = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    }
    let normed = x.broadcast_div(&(x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?)?;
    let weight = if one_plus {
        (i.tensor(1) + 1.0)?
    } else {
        i.tensor(1).clone()
    };
    normed.broadcast_mul(&weight)
}

#[test]
fn rms_norm_eps_1e5() {
    expect_variant(rms_norm("v_rms_eps"), "rms_norm(eps=1e-5)", |i| {
        rms_port(i, 1e-5, false, false)
    });
}

#[test]
fn rms_norm_that_subtracts_the_mean() {
    expect_variant(
        rms_norm("v_rms_centered"),
        "mean subtracted (layer norm)",
        |i| rms_port(i, 1e-6, true, false),
    );
}

#[test]
fn rms_norm_with_one_plus_weight() {
    expect_variant(rms_norm("v_rms_one_plus"), "scaled by (1 + weight)", |i| {
        rms_port(i, 1e-6, false, true)
    });
}

fn linear_layer(name: &str, d_out: &str) -> Layer {
    Layer::function(name, "zoo_ref.linear")
        .dim("b", 1, 4)
        .dim("d", 2, 16)
        .dim("e", 2, 16)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", [d_out, "d"], Dist::normal(0.0, 0.3))
        .arg("bias", [d_out], Dist::default())
}

#[test]
fn linear_without_bias() {
    expect_variant(linear_layer("v_linear_no_bias", "e"), "no bias", |i| {
        i.tensor(0).matmul(&i.tensor(1).t()?)
    });
}

#[test]
fn linear_with_an_untransposed_weight() {
    // Square weights only: otherwise the shapes do not even fit.
    expect_variant(
        linear_layer("v_linear_untransposed", "d"),
        "x @ weight (weight not transposed)",
        |i| i.tensor(0).matmul(i.tensor(1))?.broadcast_add(i.tensor(2)),
    );
}

#[test]
fn embedding_scaled_by_sqrt_d() {
    let layer = Layer::function("v_embedding_scaled", "zoo_ref.embedding")
        .dim("t", 1, 16)
        .dim("vocab", 2, 50)
        .dim("d", 2, 32)
        .arg("ids", ["t"], Dist::int(0, "vocab"))
        .arg("weight", ["vocab", "d"], Dist::default());
    expect_variant(layer, "rows scaled by √d", |i| {
        let d = i.tensor(1).dim(1)?;
        candle_nn::Embedding::new(i.tensor(1).clone(), d).forward(i.tensor(0))? * (d as f64).sqrt()
    });
}

fn conv_layer(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.conv1d")
        .dim("b", 1, 2)
        .dim("c", 1, 8)
        .dim("o", 1, 8)
        .dim("t", 6, 24)
        .dim("k", 2, 5)
        .arg("x", ["b", "c", "t"], Dist::default())
        .arg("weight", ["o", "c", "k"], Dist::normal(0.0, 0.3))
        .arg("bias", ["o"], Dist::default())
        .konst("stride", 2)
        .konst("padding", 2)
}

fn conv_port(
    i: &PortInputs,
    bias: bool,
    flip: bool,
    padding: usize,
    stride: usize,
) -> Result<Tensor> {
    let mut weight = i.tensor(1).clone();
    if flip {
        let k = weight.dim(2)?;
        let reversed = Tensor::new((0..k as u32).rev().collect::<Vec<_>>(), weight.device())?;
        weight = weight.index_select(&reversed, 2)?;
    }
    let y = i.tensor(0).conv1d(&weight, padding, stride, 1, 1)?;
    if bias {
        y.broadcast_add(&i.tensor(2).reshape((1, (), 1))?)
    } else {
        Ok(y)
    }
}

#[test]
fn conv1d_without_bias() {
    expect_variant(conv_layer("v_conv_no_bias"), "no bias", |i| {
        conv_port(i, false, false, 2, 2)
    });
}

#[test]
fn conv1d_with_a_flipped_kernel() {
    expect_variant(
        conv_layer("v_conv_flipped"),
        "kernel flipped (a true convolution)",
        |i| conv_port(i, true, true, 2, 2),
    );
}

#[test]
fn conv1d_without_padding() {
    expect_variant(conv_layer("v_conv_unpadded"), "padding=0", |i| {
        conv_port(i, true, false, 0, 2)
    });
}

#[test]
fn conv1d_without_stride() {
    expect_variant(conv_layer("v_conv_unstrided"), "stride=1", |i| {
        conv_port(i, true, false, 2, 1)
    });
}

fn attention_layer(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.causal_attention")
        .dim("b", 1, 2)
        .dim("h", 1, 2)
        .dim("t", 2, 12)
        .dim("d", 2, 16)
        .arg("q", ["b", "h", "t", "d"], Dist::default())
        .arg("k", ["b", "h", "t", "d"], Dist::default())
        .arg("v", ["b", "h", "t", "d"], Dist::default())
}

/// Attention with a configurable scale and mask.
fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let t = q.dim(2)?;
    let mut scores = (q.matmul(&k.t()?)? * scale)?;
    if causal {
        let mask = Tensor::tril2(t, DType::U8, q.device())?.broadcast_as(scores.shape())?;
        let neg_inf = Tensor::new(f32::NEG_INFINITY, q.device())?
            .to_dtype(scores.dtype())?
            .broadcast_as(scores.shape())?;
        scores = mask.where_cond(&scores, &neg_inf)?;
    }
    candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(v)
}

#[test]
fn attention_scaled_by_one_over_d() {
    expect_variant(
        attention_layer("v_attn_one_over_d"),
        "scale 1/d instead of 1/√d",
        |i| {
            let d = i.tensor(0).dim(3)? as f64;
            attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0 / d, true)
        },
    );
}

#[test]
fn attention_without_the_causal_mask() {
    expect_variant(attention_layer("v_attn_unmasked"), "no causal mask", |i| {
        let d = i.tensor(0).dim(3)? as f64;
        attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0 / d.sqrt(), false)
    });
}

#[test]
fn attention_without_the_scale() {
    expect_variant(
        attention_layer("v_attn_unscaled"),
        "scores not scaled",
        |i| attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0, true),
    );
}

fn mlp_layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.MLP")
        .init("d_model", 8usize)
        .init("hidden", 16usize)
        .dim("b", 1, 3)
        .arg("x", ["b".into(), DimExpr::Lit(8)], Dist::default())
}

#[test]
fn mlp_with_gelu_tanh() {
    expect_variant(
        mlp_layer("v_mlp_gelu_tanh"),
        "gelu(approximate='tanh')",
        |i| {
            let vb = i.var_builder();
            let (fc1, fc2) = (linear(8, 16, vb.pp("fc1"))?, linear(16, 8, vb.pp("fc2"))?);
            fc2.forward(&fc1.forward(i.tensor(0))?.gelu()?)
        },
    );
}

#[test]
fn mlp_without_biases() {
    expect_variant(mlp_layer("v_mlp_no_bias"), "biases dropped", |i| {
        let vb = i.var_builder();
        let (fc1, fc2) = (
            linear_no_bias(8, 16, vb.pp("fc1"))?,
            linear_no_bias(16, 8, vb.pp("fc2"))?,
        );
        fc2.forward(&fc1.forward(i.tensor(0))?.gelu_erf()?)
    });
}

fn block_layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.TransformerBlock")
        .init("d_model", 16usize)
        .init("n_heads", 2usize)
        .init("hidden", 32usize)
        .dim("b", 1, 2)
        .dim("t", 2, 8)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(16)],
            Dist::default(),
        )
}

/// The parts of the zoo's block, to rebuild it wrongly.
fn block_parts(vb: &VarBuilder) -> Result<(Norm, CausalSelfAttention, Norm, Mlp)> {
    Ok((
        Norm::new(vb.pp("ln1"), 16)?,
        CausalSelfAttention::new(vb.pp("attn"), 16, 2)?,
        Norm::new(vb.pp("ln2"), 16)?,
        Mlp::new(vb.pp("mlp"), 16, 32)?,
    ))
}

#[test]
fn block_in_post_norm_order() {
    expect_variant(
        block_layer("v_block_post_norm"),
        "post-norm (x = ln(x + f(x)))",
        |i| {
            let (ln1, attn, ln2, mlp) = block_parts(&i.var_builder())?;
            let x = i.tensor(0);
            let x = ln1.forward(&(x + attn.forward(x)?)?)?;
            ln2.forward(&(&x + mlp.forward(&x)?)?)
        },
    );
}

#[test]
fn block_with_gelu_tanh_in_its_mlp() {
    expect_variant(
        block_layer("v_block_gelu_tanh"),
        "MLP with gelu(approximate='tanh')",
        |i| {
            let vb = i.var_builder();
            let (ln1, attn, ln2, _) = block_parts(&vb)?;
            let (fc1, fc2) = (
                linear(16, 32, vb.pp("mlp.fc1"))?,
                linear(32, 16, vb.pp("mlp.fc2"))?,
            );
            let x = i.tensor(0);
            let x = (x + attn.forward(&ln1.forward(x)?)?)?;
            &x + fc2.forward(&fc1.forward(&ln2.forward(&x)?)?.gelu()?)?
        },
    );
}

#[test]
fn block_without_the_causal_mask() {
    expect_variant(
        block_layer("v_block_unmasked"),
        "attention without the causal mask",
        |i| {
            let vb = i.var_builder();
            let (ln1, _, ln2, mlp) = block_parts(&vb)?;
            let (qkv, proj) = (
                linear(16, 48, vb.pp("attn.qkv"))?,
                linear(16, 16, vb.pp("attn.proj"))?,
            );
            let x = i.tensor(0);
            let (b, t, d) = x.dims3()?;
            let h = qkv.forward(&ln1.forward(x)?)?;
            let heads = |n: usize| {
                h.narrow(D::Minus1, n * d, d)?
                    .reshape((b, t, 2, d / 2))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let y = attention(
                &heads(0)?,
                &heads(1)?,
                &heads(2)?,
                1.0 / ((d / 2) as f64).sqrt(),
                false,
            )?;
            let x = (x + proj.forward(&y.transpose(1, 2)?.reshape((b, t, d))?)?)?;
            &x + mlp.forward(&ln2.forward(&x)?)?
        },
    );
}
