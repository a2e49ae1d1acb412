//! The wrong ports of `tests/variants.rs`: each makes the mistake of one known variant of the
//! zoo's references (`reference_py/zoo_ref/variants.py`). Shared with `tests/mutations.rs`, which
//! checks that the mutation diagnosis names the same mistake with the variants turned off.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{linear, linear_no_bias, VarBuilder};
use golden::{DimExpr, Dist, Layer, PortInputs};
use golden_zoo::blocks::{CausalSelfAttention, Mlp, Norm};

/// A port as the wrong-port tables hold it (shared: golden runs a port on a thread of its own).
pub type BoxedPort = std::sync::Arc<dyn Fn(&PortInputs) -> Result<Tensor> + Send + Sync>;

/// A table's port as a check takes it.
pub fn callable(
    port: &BoxedPort,
) -> impl Fn(&PortInputs) -> Result<Tensor> + Clone + Send + Sync + 'static {
    let port = port.clone();
    move |i: &PortInputs| port(i)
}

/// A wrong port, its check, and the variant it makes.
pub struct VariantPort {
    /// The check (its name is unique across the suites: it names its golden store).
    pub layer: Layer,
    /// The variant's name, as `@variant(name=...)` declares it.
    pub variant: &'static str,
    /// The port.
    pub port: BoxedPort,
}

impl VariantPort {
    fn new(
        layer: Layer,
        variant: &'static str,
        port: impl Fn(&PortInputs) -> Result<Tensor> + Send + Sync + 'static,
    ) -> VariantPort {
        VariantPort {
            layer,
            variant,
            port: std::sync::Arc::new(port),
        }
    }
}

/// Every variant port, in the order of `tests/variants.rs`.
pub fn all() -> Vec<VariantPort> {
    vec![
        gelu_tanh_for_erf(),
        gelu_erf_for_tanh(),
        silu_without_the_x(),
        gelu_for_silu(),
        softmax_over_dim_0(),
        softmax_over_dim_1(),
        softmax_over_dim_2_of_four(),
        log_softmax_for_softmax(),
        layer_norm_eps_1e3(),
        layer_norm_eps_1e6(),
        layer_norm_eps_1e12(),
        layer_norm_unbiased_variance(),
        layer_norm_eps_outside_the_sqrt(),
        rms_norm_eps_1e5(),
        rms_norm_that_subtracts_the_mean(),
        rms_norm_with_one_plus_weight(),
        linear_without_bias(),
        linear_with_an_untransposed_weight(),
        embedding_scaled_by_sqrt_d(),
        conv1d_without_bias(),
        conv1d_with_a_flipped_kernel(),
        conv1d_without_padding(),
        conv1d_without_stride(),
        attention_scaled_by_one_over_d(),
        attention_without_the_causal_mask(),
        attention_without_the_scale(),
        mlp_with_gelu_tanh(),
        mlp_without_biases(),
        block_in_post_norm_order(),
        block_with_gelu_tanh_in_its_mlp(),
        block_without_the_causal_mask(),
    ]
}

fn unary(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
}

pub fn gelu_tanh_for_erf() -> VariantPort {
    VariantPort::new(
        unary("v_gelu_tanh", "zoo_ref.gelu"),
        "gelu(approximate='tanh')",
        |i| i.tensor(0).gelu(),
    )
}

pub fn gelu_erf_for_tanh() -> VariantPort {
    VariantPort::new(
        unary("v_gelu_erf", "zoo_ref.gelu_tanh"),
        "gelu (exact erf form)",
        |i| i.tensor(0).gelu_erf(),
    )
}

pub fn silu_without_the_x() -> VariantPort {
    VariantPort::new(unary("v_silu_sigmoid", "zoo_ref.silu"), "sigmoid(x)", |i| {
        candle_nn::ops::sigmoid(i.tensor(0))
    })
}

pub fn gelu_for_silu() -> VariantPort {
    VariantPort::new(unary("v_silu_gelu", "zoo_ref.silu"), "gelu", |i| {
        i.tensor(0).gelu_erf()
    })
}

fn softmax_layer(name: &str, rank: usize) -> Layer {
    let axes = ["a", "b", "t", "n"];
    let mut layer = Layer::function(name, "zoo_ref.softmax");
    for axis in &axes[4 - rank..] {
        layer = layer.dim(axis, 2, 6);
    }
    layer.arg("x", axes[4 - rank..].to_vec(), Dist::default())
}

pub fn softmax_over_dim_0() -> VariantPort {
    VariantPort::new(softmax_layer("v_softmax_0", 3), "softmax(dim=0)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 0)
    })
}

pub fn softmax_over_dim_1() -> VariantPort {
    VariantPort::new(softmax_layer("v_softmax_1", 3), "softmax(dim=1)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 1)
    })
}

pub fn softmax_over_dim_2_of_four() -> VariantPort {
    VariantPort::new(softmax_layer("v_softmax_2", 4), "softmax(dim=2)", |i| {
        candle_nn::ops::softmax(i.tensor(0), 2)
    })
}

pub fn log_softmax_for_softmax() -> VariantPort {
    VariantPort::new(softmax_layer("v_log_softmax", 3), "log_softmax", |i| {
        candle_nn::ops::log_softmax(i.tensor(0), D::Minus1)
    })
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

pub fn layer_norm_eps_1e3() -> VariantPort {
    VariantPort::new(layer_norm("v_ln_eps_1e3"), "layer_norm(eps=0.001)", |i| {
        norm_port(i, 1e-3, false, false)
    })
}

pub fn layer_norm_eps_1e6() -> VariantPort {
    VariantPort::new(layer_norm("v_ln_eps_1e6"), "layer_norm(eps=1e-06)", |i| {
        norm_port(i, 1e-6, false, false)
    })
}

pub fn layer_norm_eps_1e12() -> VariantPort {
    VariantPort::new(layer_norm("v_ln_eps_1e12"), "layer_norm(eps=1e-12)", |i| {
        norm_port(i, 1e-12, false, false)
    })
}

pub fn layer_norm_unbiased_variance() -> VariantPort {
    VariantPort::new(
        layer_norm("v_ln_unbiased"),
        "unbiased variance (N-1)",
        |i| norm_port(i, 1e-5, true, false),
    )
}

pub fn layer_norm_eps_outside_the_sqrt() -> VariantPort {
    VariantPort::new(
        layer_norm("v_ln_eps_outside"),
        "eps outside the square root",
        |i| norm_port(i, 1e-5, false, true),
    )
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

pub fn rms_norm_eps_1e5() -> VariantPort {
    VariantPort::new(rms_norm("v_rms_eps"), "rms_norm(eps=1e-5)", |i| {
        rms_port(i, 1e-5, false, false)
    })
}

pub fn rms_norm_that_subtracts_the_mean() -> VariantPort {
    VariantPort::new(
        rms_norm("v_rms_centered"),
        "mean subtracted (layer norm)",
        |i| rms_port(i, 1e-6, true, false),
    )
}

pub fn rms_norm_with_one_plus_weight() -> VariantPort {
    VariantPort::new(rms_norm("v_rms_one_plus"), "scaled by (1 + weight)", |i| {
        rms_port(i, 1e-6, false, true)
    })
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

pub fn linear_without_bias() -> VariantPort {
    VariantPort::new(linear_layer("v_linear_no_bias", "e"), "no bias", |i| {
        i.tensor(0).matmul(&i.tensor(1).t()?)
    })
}

pub fn linear_with_an_untransposed_weight() -> VariantPort {
    // Square weights only: otherwise the shapes do not even fit.
    VariantPort::new(
        linear_layer("v_linear_untransposed", "d"),
        "x @ weight (weight not transposed)",
        |i| i.tensor(0).matmul(i.tensor(1))?.broadcast_add(i.tensor(2)),
    )
}

pub fn embedding_scaled_by_sqrt_d() -> VariantPort {
    let layer = Layer::function("v_embedding_scaled", "zoo_ref.embedding")
        .dim("t", 1, 16)
        .dim("vocab", 2, 50)
        .dim("d", 2, 32)
        .arg("ids", ["t"], Dist::int(0, "vocab"))
        .arg("weight", ["vocab", "d"], Dist::default());
    VariantPort::new(layer, "rows scaled by √d", |i| {
        let d = i.tensor(1).dim(1)?;
        candle_nn::Embedding::new(i.tensor(1).clone(), d).forward(i.tensor(0))? * (d as f64).sqrt()
    })
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

pub fn conv1d_without_bias() -> VariantPort {
    VariantPort::new(conv_layer("v_conv_no_bias"), "no bias", |i| {
        conv_port(i, false, false, 2, 2)
    })
}

pub fn conv1d_with_a_flipped_kernel() -> VariantPort {
    VariantPort::new(
        conv_layer("v_conv_flipped"),
        "kernel flipped (a true convolution)",
        |i| conv_port(i, true, true, 2, 2),
    )
}

pub fn conv1d_without_padding() -> VariantPort {
    VariantPort::new(conv_layer("v_conv_unpadded"), "padding=0", |i| {
        conv_port(i, true, false, 0, 2)
    })
}

pub fn conv1d_without_stride() -> VariantPort {
    VariantPort::new(conv_layer("v_conv_unstrided"), "stride=1", |i| {
        conv_port(i, true, false, 2, 1)
    })
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

pub fn attention_scaled_by_one_over_d() -> VariantPort {
    VariantPort::new(
        attention_layer("v_attn_one_over_d"),
        "scale 1/d instead of 1/√d",
        |i| {
            let d = i.tensor(0).dim(3)? as f64;
            attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0 / d, true)
        },
    )
}

pub fn attention_without_the_causal_mask() -> VariantPort {
    VariantPort::new(attention_layer("v_attn_unmasked"), "no causal mask", |i| {
        let d = i.tensor(0).dim(3)? as f64;
        attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0 / d.sqrt(), false)
    })
}

pub fn attention_without_the_scale() -> VariantPort {
    VariantPort::new(
        attention_layer("v_attn_unscaled"),
        "scores not scaled",
        |i| attention(i.tensor(0), i.tensor(1), i.tensor(2), 1.0, true),
    )
}

fn mlp_layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.MLP")
        .init("d_model", 8usize)
        .init("hidden", 16usize)
        .dim("b", 1, 3)
        .arg("x", ["b".into(), DimExpr::Lit(8)], Dist::default())
}

pub fn mlp_with_gelu_tanh() -> VariantPort {
    VariantPort::new(
        mlp_layer("v_mlp_gelu_tanh"),
        "gelu(approximate='tanh')",
        |i| {
            let vb = i.var_builder();
            let (fc1, fc2) = (linear(8, 16, vb.pp("fc1"))?, linear(16, 8, vb.pp("fc2"))?);
            fc2.forward(&fc1.forward(i.tensor(0))?.gelu()?)
        },
    )
}

pub fn mlp_without_biases() -> VariantPort {
    VariantPort::new(mlp_layer("v_mlp_no_bias"), "biases dropped", |i| {
        let vb = i.var_builder();
        let (fc1, fc2) = (
            linear_no_bias(8, 16, vb.pp("fc1"))?,
            linear_no_bias(16, 8, vb.pp("fc2"))?,
        );
        fc2.forward(&fc1.forward(i.tensor(0))?.gelu_erf()?)
    })
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

pub fn block_in_post_norm_order() -> VariantPort {
    VariantPort::new(
        block_layer("v_block_post_norm"),
        "post-norm (x = ln(x + f(x)))",
        |i| {
            let (ln1, attn, ln2, mlp) = block_parts(&i.var_builder())?;
            let x = i.tensor(0);
            let x = ln1.forward(&(x + attn.forward(x)?)?)?;
            ln2.forward(&(&x + mlp.forward(&x)?)?)
        },
    )
}

pub fn block_with_gelu_tanh_in_its_mlp() -> VariantPort {
    VariantPort::new(
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
    )
}

pub fn block_without_the_causal_mask() -> VariantPort {
    VariantPort::new(
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
    )
}

/// What the mutation diagnosis must name for a variant port, with the declared variants turned
/// off: text of the mutated call and of its site. `None` where no single mutation of the
/// reference's torch calls makes the port (a reordered block, a formula the reference never
/// calls).
pub fn expected_mutation(layer: &str) -> Option<(&'static str, &'static str)> {
    Some(match layer {
        "v_gelu_tanh" => ("F.gelu(approximate='tanh')", "zoo_ref/functional.py:9"),
        "v_gelu_erf" => ("F.gelu(approximate='none')", "zoo_ref/functional.py:14"),
        "v_silu_sigmoid" => ("sigmoid instead of silu", "zoo_ref/functional.py:18"),
        "v_silu_gelu" => ("gelu instead of silu", "zoo_ref/functional.py:18"),
        "v_softmax_0" => ("torch.softmax(dim=0)", "zoo_ref/functional.py:23"),
        "v_softmax_1" => ("torch.softmax(dim=1)", "zoo_ref/functional.py:23"),
        "v_softmax_2" => ("torch.softmax(dim=2)", "zoo_ref/functional.py:23"),
        "v_log_softmax" => ("log_softmax instead of softmax", "zoo_ref/functional.py:23"),
        "v_ln_eps_1e3" => ("F.layer_norm(eps=0.001)", "zoo_ref/functional.py:27"),
        "v_ln_eps_1e6" => ("F.layer_norm(eps=1e-06)", "zoo_ref/functional.py:27"),
        "v_ln_eps_1e12" => ("F.layer_norm(eps=1e-12)", "zoo_ref/functional.py:27"),
        "v_ln_unbiased" => (
            "F.layer_norm with the unbiased variance",
            "zoo_ref/functional.py:27",
        ),
        "v_ln_eps_outside" => (
            "F.layer_norm with eps outside the square root",
            "zoo_ref/functional.py:27",
        ),
        "v_rms_eps" => (
            "Tensor.add with 1e-05 instead of 1e-06",
            "zoo_ref/functional.py:35",
        ),
        "v_rms_centered" => return None,
        "v_rms_one_plus" => (
            "with the weight as (1 + weight)",
            "zoo_ref/functional.py:35",
        ),
        "v_block_post_norm" => (
            "post-norm: `ln1` and `ln2` (LayerNorm) applied to the residual sums",
            "zoo_ref/modules.py:69",
        ),
        "v_linear_no_bias" => ("F.linear without its bias", "zoo_ref/functional.py:39"),
        "v_linear_untransposed" => (
            "F.linear with the weight transposed",
            "zoo_ref/functional.py:39",
        ),
        "v_embedding_scaled" => ("F.embedding rows scaled ×√d", "zoo_ref/functional.py:43"),
        "v_conv_no_bias" => ("torch.conv1d without its bias", "zoo_ref/functional.py:47"),
        "v_conv_flipped" => (
            "torch.conv1d with the kernel flipped",
            "zoo_ref/functional.py:47",
        ),
        "v_conv_unpadded" => ("torch.conv1d(padding=0)", "zoo_ref/functional.py:47"),
        "v_conv_unstrided" => ("torch.conv1d(stride=1)", "zoo_ref/functional.py:47"),
        "v_attn_one_over_d" => (
            "F.scaled_dot_product_attention(scale=1/d)",
            "zoo_ref/functional.py:52",
        ),
        "v_attn_unmasked" => (
            "F.scaled_dot_product_attention without the causal mask",
            "zoo_ref/functional.py:52",
        ),
        "v_attn_unscaled" => (
            "F.scaled_dot_product_attention(scale=1)",
            "zoo_ref/functional.py:52",
        ),
        "v_mlp_gelu_tanh" | "v_block_gelu_tanh" => {
            ("F.gelu(approximate='tanh')", "zoo_ref/modules.py:19")
        }
        "v_mlp_no_bias" => (
            "F.linear without its bias",
            "all 2 of its call sites: zoo_ref/modules.py:19",
        ),
        "v_block_unmasked" => ("Tensor.masked_fill skipped", "zoo_ref/modules.py:53"),
        other => panic!("no expected mutation for `{other}`"),
    })
}
