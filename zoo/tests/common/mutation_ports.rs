//! Wrong ports for the mutation diagnosis (`tests/mutations.rs`): one per entry of the catalogue
//! (`reference_py/golden_ref/catalogue.py`), against references that declare no variants
//! (`reference_py/zoo_ref/undeclared.py`, and torch's own modules), each with the cause and the
//! site the failure message must name.

use super::variant_ports::BoxedPort;
use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use golden::{DimExpr, Dist, Layer, PortInputs};

/// The cause and the site a diagnosis must name.
pub type Expected = (&'static str, &'static str);

/// A wrong port and what the diagnosis must say about it.
pub struct MutationPort {
    /// The check (its name is unique across the suites).
    pub layer: Layer,
    /// The port.
    pub port: BoxedPort,
    /// Text the named mutation must contain (its `what`).
    pub cause: &'static str,
    /// Text its site must contain (`file:line`; empty for a mutation of the inputs).
    pub site: &'static str,
}

fn wrong(
    layer: Layer,
    cause: &'static str,
    site: &'static str,
    port: impl Fn(&PortInputs) -> Result<Tensor> + Send + Sync + 'static,
) -> MutationPort {
    MutationPort {
        layer,
        port: std::sync::Arc::new(port),
        cause,
        site,
    }
}

// --- attention written out -----------------------------------------------------------------------

fn qkv(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("b", 1, 2)
        .dim("h", 1, 2)
        .dim("t", 2, 8)
        .dim("d", 2, 16)
        .arg("q", ["b", "h", "t", "d"], Dist::default())
        .arg("k", ["b", "h", "t", "d"], Dist::default())
        .arg("v", ["b", "h", "t", "d"], Dist::default())
}

/// Which positions a port lets attend.
#[derive(Clone, Copy)]
enum Mask {
    /// j ≤ i, as the reference.
    Causal,
    /// Everything.
    None,
    /// j < i: the diagonal masked too.
    Strict,
}

fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: Mask,
    softmax_dim: usize,
) -> Result<Tensor> {
    let t = q.dim(2)?;
    let mut scores = (q.matmul(&k.t()?)? * scale)?;
    let allowed: Vec<u8> = (0..t)
        .flat_map(|i| {
            (0..t).map(move |j| match mask {
                Mask::Causal => u8::from(j <= i),
                Mask::None => 1,
                Mask::Strict => u8::from(j < i),
            })
        })
        .collect();
    let allowed = Tensor::from_vec(allowed, (t, t), q.device())?.broadcast_as(scores.shape())?;
    let neg_inf = Tensor::new(f32::NEG_INFINITY, q.device())?
        .to_dtype(scores.dtype())?
        .broadcast_as(scores.shape())?;
    scores = allowed.where_cond(&scores, &neg_inf)?;
    candle_nn::ops::softmax(&scores, softmax_dim)?.matmul(v)
}

fn head_dim(i: &PortInputs) -> Result<f64> {
    Ok(i.tensor(0).dim(3)? as f64)
}

pub fn attention_scaled_by_one_over_d() -> MutationPort {
    wrong(
        qkv("m_attn_one_over_d", "zoo_ref.undeclared.attention"),
        "(the factor squared)",
        "zoo_ref/undeclared.py:16",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(0),
                i.tensor(1),
                i.tensor(2),
                1.0 / d,
                Mask::Causal,
                3,
            )
        },
    )
}

pub fn attention_without_its_causal_mask() -> MutationPort {
    wrong(
        qkv("m_attn_unmasked", "zoo_ref.undeclared.attention"),
        "Tensor.masked_fill skipped (the mask not applied)",
        "zoo_ref/undeclared.py:18",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(0),
                i.tensor(1),
                i.tensor(2),
                1.0 / d.sqrt(),
                Mask::None,
                3,
            )
        },
    )
}

pub fn attention_mask_off_by_one() -> MutationPort {
    wrong(
        qkv("m_attn_strict_mask", "zoo_ref.undeclared.attention"),
        "torch.tril(diagonal=-1)",
        "zoo_ref/undeclared.py:17",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(0),
                i.tensor(1),
                i.tensor(2),
                1.0 / d.sqrt(),
                Mask::Strict,
                3,
            )
        },
    )
}

pub fn attention_softmax_over_the_queries() -> MutationPort {
    wrong(
        qkv("m_attn_softmax_dim", "zoo_ref.undeclared.attention"),
        "torch.softmax(dim=2)",
        "zoo_ref/undeclared.py:19",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(0),
                i.tensor(1),
                i.tensor(2),
                1.0 / d.sqrt(),
                Mask::Causal,
                2,
            )
        },
    )
}

pub fn attention_with_q_and_k_swapped() -> MutationPort {
    wrong(
        qkv("m_attn_q_k_swapped", "zoo_ref.undeclared.attention"),
        "its inputs `q` and `k` swapped",
        "",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(1),
                i.tensor(0),
                i.tensor(2),
                1.0 / d.sqrt(),
                Mask::Causal,
                3,
            )
        },
    )
}

pub fn additive_mask_never_added() -> MutationPort {
    wrong(
        qkv(
            "m_attn_additive_unmasked",
            "zoo_ref.undeclared.attention_additive",
        ),
        "the additive attention mask not added",
        "zoo_ref/undeclared.py:27",
        |i| {
            let d = head_dim(i)?;
            attention(
                i.tensor(0),
                i.tensor(1),
                i.tensor(2),
                1.0 / d.sqrt(),
                Mask::None,
                3,
            )
        },
    )
}

pub fn masked_fill_with_minus_infinity() -> MutationPort {
    let layer = Layer::function("m_masked_fill_value", "zoo_ref.undeclared.masked_softmax")
        .dim("b", 1, 4)
        .dim("t", 1, 4)
        .arg("scores", ["b", "t"], Dist::default())
        .arg("keep", ["b", "t"], Dist::Bool);
    wrong(
        layer,
        "Tensor.masked_fill(value=-inf)",
        "zoo_ref/undeclared.py:33",
        |i| {
            let scores = i.tensor(0);
            let fill = Tensor::new(f32::NEG_INFINITY, scores.device())?
                .to_dtype(scores.dtype())?
                .broadcast_as(scores.shape())?;
            candle_nn::ops::softmax(&i.tensor(1).where_cond(scores, &fill)?, D::Minus1)
        },
    )
}

// --- norms ---------------------------------------------------------------------------------------

fn norm_layer(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("b", 1, 4)
        .dim("d", 2, 32)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .arg("bias", ["d"], Dist::normal(0.0, 0.1))
        .konst("eps", 1e-5)
}

fn layer_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    n: f64,
) -> Result<Tensor> {
    let d = x.dim(D::Minus1)? as f64;
    let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
    let var = (centered.sqr()?.sum_keepdim(D::Minus1)? / (d - n))?;
    let mut y = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    if let Some(w) = weight {
        y = y.broadcast_mul(w)?;
    }
    if let Some(b) = bias {
        y = y.broadcast_add(b)?;
    }
    Ok(y)
}

pub fn layer_norm_with_the_unbiased_variance() -> MutationPort {
    wrong(
        norm_layer("m_ln_unbiased", "zoo_ref.undeclared.layer_norm"),
        "Tensor.var(correction=1)",
        "zoo_ref/undeclared.py:39",
        |i| layer_norm(i.tensor(0), Some(i.tensor(1)), Some(i.tensor(2)), 1.0),
    )
}

pub fn layer_norm_without_its_weight() -> MutationPort {
    wrong(
        norm_layer("m_ln_no_weight", "zoo_ref.layer_norm"),
        "F.layer_norm without its weight",
        "zoo_ref/functional.py:27",
        |i| layer_norm(i.tensor(0), None, Some(i.tensor(2)), 0.0),
    )
}

pub fn layer_norm_without_its_bias() -> MutationPort {
    wrong(
        norm_layer("m_ln_no_bias", "zoo_ref.layer_norm"),
        "F.layer_norm without its bias",
        "zoo_ref/functional.py:27",
        |i| layer_norm(i.tensor(0), Some(i.tensor(1)), None, 0.0),
    )
}

pub fn layer_norm_module_with_eps_1e6() -> MutationPort {
    let layer = Layer::module("m_ln_module_eps", "torch.nn.LayerNorm")
        .init("normalized_shape", 16usize)
        .dim("b", 1, 4)
        .arg("x", ["b".into(), DimExpr::Lit(16)], Dist::default());
    wrong(
        layer,
        "F.layer_norm(eps=1e-06)",
        "torch/nn/modules/normalization.py:",
        |i| {
            let vb = i.var_builder();
            candle_nn::layer_norm(16, 1e-6, vb)?.forward(i.tensor(0))
        },
    )
}

pub fn l2_normalize_with_a_smaller_eps() -> MutationPort {
    let layer = Layer::function("m_l2_eps", "zoo_ref.undeclared.l2_normalize")
        .dim("b", 1, 4)
        .dim("d", 1, 32)
        .arg("x", ["b", "d"], Dist::default());
    wrong(
        layer,
        "Tensor.add with 1e-12 instead of 1e-06",
        "zoo_ref/undeclared.py:45",
        |i| {
            let x = i.tensor(0);
            let norm = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
            x.broadcast_div(&(norm + 1e-12)?)
        },
    )
}

/// In f16, squares of values beyond 256 overflow: the reference computes its variance in f32
/// (bf16's range would hide this, and its tolerance the rounding).
pub fn rms_norm_computed_in_f16() -> MutationPort {
    let layer = Layer::function("m_rms_f16", "zoo_ref.rms_norm")
        .dim("b", 1, 4)
        .dim("d", 1, 64)
        .arg("x", ["b", "d"], Dist::normal(0.0, 200.0))
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .konst("eps", 1e-6)
        .dtypes(&[DType::F16]);
    wrong(
        layer,
        "skipped: computed in torch.float16",
        "zoo_ref/functional.py:33",
        |i| {
            let x = i.tensor(0);
            let var = x.sqr()?.mean_keepdim(D::Minus1)?;
            x.broadcast_div(&(var + 1e-6)?.sqrt()?)?
                .broadcast_mul(i.tensor(1))
        },
    )
}

// --- linear maps, repeats, resampling, padding -----------------------------------------------------

pub fn square_linear_weight_used_untransposed() -> MutationPort {
    let layer = Layer::module("m_linear_untransposed", "torch.nn.Linear")
        .init("in_features", 8usize)
        .init("out_features", 8usize)
        .dim("b", 1, 4)
        .arg("x", ["b".into(), DimExpr::Lit(8)], Dist::default());
    wrong(
        layer,
        "F.linear with the weight transposed",
        "torch/nn/modules/linear.py:",
        |i| {
            let vb = i.var_builder();
            let (w, b) = (vb.get((8, 8), "weight")?, vb.get(8, "bias")?);
            i.tensor(0).matmul(&w)?.broadcast_add(&b)
        },
    )
}

pub fn matmul_by_the_transpose() -> MutationPort {
    let layer = Layer::function("m_matmul_transposed", "zoo_ref.undeclared.bilinear")
        .dim("b", 1, 4)
        .dim("d", 2, 16)
        .arg("x", ["b", "d"], Dist::default())
        .arg("w", ["d", "d"], Dist::default());
    wrong(
        layer,
        "Tensor.matmul with its second operand transposed",
        "zoo_ref/undeclared.py:50",
        |i| i.tensor(0).matmul(&i.tensor(1).t()?),
    )
}

pub fn heads_tiled_instead_of_interleaved() -> MutationPort {
    let layer = Layer::function("m_repeat_tiled", "zoo_ref.undeclared.expand_heads")
        .dim("b", 1, 2)
        .dim("h", 2, 4)
        .dim("t", 1, 4)
        .dim("d", 1, 4)
        .arg("kv", ["b", "h", "t", "d"], Dist::default())
        .konst("n_rep", 2);
    wrong(
        layer,
        "Tensor.repeat_interleave replaced by tiling",
        "zoo_ref/undeclared.py:55",
        |i| Tensor::cat(&[i.tensor(0), i.tensor(0)], 1),
    )
}

pub fn upsampling_with_aligned_corners() -> MutationPort {
    let layer = Layer::function("m_upsample_align", "zoo_ref.undeclared.upsample")
        .dim("b", 1, 2)
        .dim("c", 1, 2)
        .dim("h", 2, 6)
        .dim("w", 2, 6)
        .arg("x", ["b", "c", "h", "w"], Dist::default());
    wrong(
        layer,
        "F.interpolate(align_corners=True)",
        "zoo_ref/undeclared.py:60",
        |i| {
            let (_, _, h, w) = i.tensor(0).dims4()?;
            i.tensor(0).upsample_bilinear2d(2 * h, 2 * w, true)
        },
    )
}

pub fn causal_conv_padded_on_the_wrong_side() -> MutationPort {
    let layer = Layer::function("m_pad_sides", "zoo_ref.undeclared.causal_conv1d")
        .dim("b", 1, 2)
        .dim("c", 1, 4)
        .dim("o", 1, 4)
        .dim("t", 2, 12)
        .dim("k", 2, 4)
        .arg("x", ["b", "c", "t"], Dist::default())
        .arg("weight", ["o", "c", "k"], Dist::normal(0.0, 0.3))
        .arg("bias", ["o"], Dist::default());
    wrong(
        layer,
        "F.pad with the two sides swapped",
        "zoo_ref/undeclared.py:66",
        |i| {
            let k = i.tensor(1).dim(2)?;
            let x = i.tensor(0).pad_with_zeros(D::Minus1, 0, k - 1)?;
            x.conv1d(i.tensor(1), 0, 1, 1, 1)?
                .broadcast_add(&i.tensor(2).reshape((1, (), 1))?)
        },
    )
}

// --- a LLaMA-style block -------------------------------------------------------------------------

/// The mistakes a port of `zoo_ref.undeclared.LlamaBlock` can make.
#[derive(Clone, Copy)]
struct Llama {
    rope_pairs: bool,
    tile_kv: bool,
    swap_gate_up: bool,
    theta: f64,
    eps: f64,
    heads_straight: bool,
    merge_without_transpose: bool,
    gelu: bool,
}

const RIGHT: Llama = Llama {
    rope_pairs: false,
    tile_kv: false,
    swap_gate_up: false,
    theta: 500000.0,
    eps: 1e-5,
    heads_straight: false,
    merge_without_transpose: false,
    gelu: false,
};

const D_MODEL: usize = 16;
const N_HEADS: usize = 4;
const N_KV_HEADS: usize = 2;
const HIDDEN: usize = 32;

fn llama_layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.undeclared.LlamaBlock")
        .init("d_model", D_MODEL)
        .init("n_heads", N_HEADS)
        .init("n_kv_heads", N_KV_HEADS)
        .init("hidden", HIDDEN)
        .dim("b", 1, 2)
        .dim("t", 1, 6)
        .arg(
            "x",
            ["b".into(), "t".into(), DimExpr::Lit(D_MODEL)],
            Dist::default(),
        )
}

fn no_bias(vb: &VarBuilder, out: usize, inp: usize, name: &str) -> Result<Linear> {
    Ok(Linear::new(
        vb.get((out, inp), &format!("{name}.weight"))?,
        None,
    ))
}

fn llama(i: &PortInputs, o: Llama) -> Result<Tensor> {
    let vb = i.var_builder();
    let x = i.tensor(0);
    let (b, t, _) = x.dims3()?;
    let hd = D_MODEL / N_HEADS;
    let rms = |x: &Tensor, name: &str| -> Result<Tensor> {
        let w = vb.get(D_MODEL, &format!("{name}.weight"))?;
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(var + o.eps)?.sqrt()?)?.broadcast_mul(&w)
    };
    let attn = vb.pp("self_attn");
    let h = rms(x, "input_layernorm")?;
    let heads = |name: &str, n: usize| -> Result<Tensor> {
        let z = no_bias(&attn, n * hd, D_MODEL, name)?.forward(&h)?;
        if o.heads_straight {
            z.reshape((b, n, t, hd))
        } else {
            z.reshape((b, t, n, hd))?.transpose(1, 2)?.contiguous()
        }
    };
    let (q, k, v) = (
        heads("q_proj", N_HEADS)?,
        heads("k_proj", N_KV_HEADS)?,
        heads("v_proj", N_KV_HEADS)?,
    );
    // Rotary frequencies as the reference computes them, in f32.
    let inv_freq: Vec<f32> = (0..hd / 2)
        .map(|j| 1.0 / (o.theta as f32).powf((2 * j) as f32 / hd as f32))
        .collect();
    let inv_freq = Tensor::new(inv_freq.as_slice(), x.device())?;
    let positions = Tensor::arange(0u32, t as u32, x.device())?.to_dtype(DType::F32)?;
    let freqs = positions
        .unsqueeze(1)?
        .broadcast_mul(&inv_freq.unsqueeze(0)?)?;
    let (cos, sin) = (freqs.cos()?, freqs.sin()?);
    let rope = |z: &Tensor| {
        if o.rope_pairs {
            candle_nn::rotary_emb::rope_i(z, &cos, &sin)
        } else {
            candle_nn::rotary_emb::rope(z, &cos, &sin)
        }
    };
    let (q, k) = (rope(&q)?, rope(&k)?);
    let n_rep = N_HEADS / N_KV_HEADS;
    let repeat = |z: Tensor| {
        if o.tile_kv {
            Tensor::cat(&vec![&z; n_rep], 1)
        } else {
            candle_transformers::utils::repeat_kv(z, n_rep)
        }
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let y = attention(
        &q,
        &k.contiguous()?,
        &v.contiguous()?,
        1.0 / (hd as f64).sqrt(),
        Mask::Causal,
        3,
    )?;
    let y = if o.merge_without_transpose {
        y.reshape((b, t, D_MODEL))?
    } else {
        y.transpose(1, 2)?.reshape((b, t, D_MODEL))?
    };
    let x = (x + no_bias(&attn, D_MODEL, D_MODEL, "o_proj")?.forward(&y)?)?;
    let h = rms(&x, "post_attention_layernorm")?;
    let mlp = vb.pp("mlp");
    let mut gate = no_bias(&mlp, HIDDEN, D_MODEL, "gate_proj")?.forward(&h)?;
    let mut up = no_bias(&mlp, HIDDEN, D_MODEL, "up_proj")?.forward(&h)?;
    if o.swap_gate_up {
        std::mem::swap(&mut gate, &mut up);
    }
    let gate = if o.gelu {
        gate.gelu_erf()?
    } else {
        gate.silu()?
    };
    &x + no_bias(&mlp, D_MODEL, HIDDEN, "down_proj")?.forward(&(gate * up)?)?
}

/// The correct port (`tests/mutations.rs` checks that it passes with nothing reported).
pub fn llama_right() -> (Layer, BoxedPort) {
    (
        llama_layer("m_llama_right"),
        std::sync::Arc::new(|i| llama(i, RIGHT)),
    )
}

pub fn llama_rotary_on_interleaved_pairs() -> MutationPort {
    wrong(
        llama_layer("m_llama_rope_pairs"),
        "rotary embeddings on interleaved pairs",
        "zoo_ref/undeclared.py:89",
        |i| {
            llama(
                i,
                Llama {
                    rope_pairs: true,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_kv_heads_tiled() -> MutationPort {
    wrong(
        llama_layer("m_llama_kv_tiled"),
        "Tensor.expand as tiling",
        "zoo_ref/undeclared.py:96",
        |i| {
            llama(
                i,
                Llama {
                    tile_kv: true,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_gate_and_up_swapped() -> MutationPort {
    wrong(
        llama_layer("m_llama_gate_up"),
        "the outputs of `self.gate_proj(x)` and `self.up_proj(x)` swapped",
        "zoo_ref/undeclared.py:145",
        |i| {
            llama(
                i,
                Llama {
                    swap_gate_up: true,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_rope_theta_10000() -> MutationPort {
    wrong(
        llama_layer("m_llama_theta"),
        "Tensor.__rpow__ with 10000 instead of 500000",
        "zoo_ref/undeclared.py:102",
        |i| {
            llama(
                i,
                Llama {
                    theta: 10000.0,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_rms_norm_eps_1e6() -> MutationPort {
    wrong(
        llama_layer("m_llama_eps"),
        "Tensor.add with 1e-06 instead of 1e-05",
        "zoo_ref/undeclared.py:82",
        |i| llama(i, Llama { eps: 1e-6, ..RIGHT }),
    )
}

pub fn llama_heads_split_in_the_wrong_order() -> MutationPort {
    wrong(
        llama_layer("m_llama_heads_order"),
        "Tensor.view splitting axes 1 and 2 in the other order",
        "zoo_ref/undeclared.py:125",
        |i| {
            llama(
                i,
                Llama {
                    heads_straight: true,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_heads_merged_without_transpose() -> MutationPort {
    wrong(
        llama_layer("m_llama_merge"),
        "Tensor.transpose(1, 2) dropped",
        "zoo_ref/undeclared.py:134",
        |i| {
            llama(
                i,
                Llama {
                    merge_without_transpose: true,
                    ..RIGHT
                },
            )
        },
    )
}

pub fn llama_gelu_for_silu() -> MutationPort {
    wrong(
        llama_layer("m_llama_gelu"),
        "gelu instead of silu",
        "zoo_ref/undeclared.py:145",
        |i| {
            llama(
                i,
                Llama {
                    gelu: true,
                    ..RIGHT
                },
            )
        },
    )
}

/// Every wrong port, by test name.
pub fn all() -> Vec<(&'static str, MutationPort)> {
    macro_rules! ports {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), $name())),*] };
    }
    ports![
        attention_scaled_by_one_over_d,
        attention_without_its_causal_mask,
        attention_mask_off_by_one,
        attention_softmax_over_the_queries,
        attention_with_q_and_k_swapped,
        additive_mask_never_added,
        masked_fill_with_minus_infinity,
        layer_norm_with_the_unbiased_variance,
        layer_norm_without_its_weight,
        layer_norm_without_its_bias,
        layer_norm_module_with_eps_1e6,
        l2_normalize_with_a_smaller_eps,
        rms_norm_computed_in_f16,
        square_linear_weight_used_untransposed,
        matmul_by_the_transpose,
        heads_tiled_instead_of_interleaved,
        upsampling_with_aligned_corners,
        causal_conv_padded_on_the_wrong_side,
        llama_rotary_on_interleaved_pairs,
        llama_kv_heads_tiled,
        llama_gate_and_up_swapped,
        llama_rope_theta_10000,
        llama_rms_norm_eps_1e6,
        llama_heads_split_in_the_wrong_order,
        llama_heads_merged_without_transpose,
        llama_gelu_for_silu,
    ]
}

// --- the value mismatches of tests/wrong_ports.rs and tests/diagnosis.rs ---------------------------

/// The wrong ports of `tests/wrong_ports.rs` and `tests/diagnosis.rs` that fail on values, as
/// there (renamed: `h_` + their name), with the mutation that must be named, or `None` where none
/// is the mistake (an output transposed or scaled, a bias added twice: the numbers' own
/// hypotheses name those).
pub fn project_value_ports() -> Vec<(Layer, BoxedPort, Option<Expected>)> {
    let unary = |name: &str, reference: &str, n: usize| {
        Layer::function(name, reference)
            .dim("b", 1, 4)
            .dim("n", 1, n)
            .arg("x", ["b", "n"], Dist::default())
    };
    let softmax3 = |name: &str, n: usize| {
        Layer::function(name, "zoo_ref.softmax")
            .dim("b", 1, 4)
            .dim("t", 1, 16)
            .dim("n", 1, n)
            .arg("x", ["b", "t", "n"], Dist::default())
    };
    let linear64 = |name: &str| {
        Layer::function(name, "zoo_ref.linear")
            .dim("b", 1, 4)
            .dim("t", 1, 8)
            .dim("d_out", 1, 16)
            .arg(
                "x",
                ["b".into(), "t".into(), DimExpr::Lit(64)],
                Dist::default(),
            )
            .arg(
                "weight",
                ["d_out".into(), DimExpr::Lit(64)],
                Dist::normal(0.0, 0.1),
            )
            .arg("bias", ["d_out"], Dist::default())
    };
    fn dense(i: &PortInputs) -> Result<Tensor> {
        Linear::new(i.tensor(1).clone(), Some(i.tensor(2).clone())).forward(i.tensor(0))
    }
    let layer_norm3 = Layer::function("h_layer_norm", "zoo_ref.layer_norm")
        .dim("b", 1, 4)
        .dim("t", 1, 16)
        .dim("d", 1, 64)
        .arg("x", ["b", "t", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .arg("bias", ["d"], Dist::normal(0.0, 0.1))
        .konst("eps", 1e-5);
    let linear_any = Layer::function("h_linear_missing_transpose", "zoo_ref.linear")
        .dim("b", 1, 4)
        .dim("d_in", 1, 32)
        .dim("d_out", 1, 32)
        .arg("x", ["b", "d_in"], Dist::default())
        .arg("weight", ["d_out", "d_in"], Dist::default())
        .arg("bias", ["d_out"], Dist::default());
    let square_softmax = Layer::function("h_softmax_transposed", "zoo_ref.softmax")
        .dim("n", 2, 8)
        .arg("x", ["n", "n"], Dist::default());
    let one_axis = |name: &str, reference: &str| {
        Layer::function(name, reference)
            .dim("n", 1, 64)
            .arg("x", ["n"], Dist::default())
    };
    let gelu: (&str, &str) = ("F.gelu(approximate='tanh')", "zoo_ref/functional.py:9");
    let softmax_dim1: (&str, &str) = ("torch.softmax(dim=1)", "zoo_ref/functional.py:23");
    vec![
        (
            unary("h_gelu", "zoo_ref.gelu", 256),
            std::sync::Arc::new(|i: &PortInputs| i.tensor(0).gelu()) as BoxedPort,
            Some(gelu),
        ),
        (
            softmax3("h_softmax", 128),
            std::sync::Arc::new(|i: &PortInputs| candle_nn::ops::softmax(i.tensor(0), 1)),
            Some(softmax_dim1),
        ),
        (
            layer_norm3,
            std::sync::Arc::new(|i: &PortInputs| {
                let x = i.tensor(0);
                let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
                let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
                centered
                    .broadcast_div(&(var + 1e-3)?.sqrt()?)?
                    .broadcast_mul(i.tensor(1))?
                    .broadcast_add(i.tensor(2))
            }),
            Some(("F.layer_norm(eps=0.001)", "zoo_ref/functional.py:27")),
        ),
        (
            linear_any,
            std::sync::Arc::new(|i: &PortInputs| dense(i)?.t()?.contiguous()),
            None,
        ),
        (
            square_softmax,
            std::sync::Arc::new(|i: &PortInputs| {
                candle_nn::ops::softmax(i.tensor(0), D::Minus1)?
                    .t()?
                    .contiguous()
            }),
            None,
        ),
        (
            linear64("h_linear_scaled"),
            std::sync::Arc::new(|i: &PortInputs| dense(i)? / 8.0),
            None,
        ),
        (
            one_axis("h_gelu_doubled", "zoo_ref.gelu"),
            std::sync::Arc::new(|i: &PortInputs| i.tensor(0).gelu_erf()? * 2.0),
            None,
        ),
        (
            linear64("h_linear_bias_twice"),
            std::sync::Arc::new(|i: &PortInputs| dense(i)?.broadcast_add(i.tensor(2))),
            None,
        ),
        (
            softmax3("h_softmax_wrong_dim", 32),
            std::sync::Arc::new(|i: &PortInputs| candle_nn::ops::softmax(i.tensor(0), 1)),
            Some(softmax_dim1),
        ),
        (
            one_axis("h_silu_zeros", "zoo_ref.silu"),
            std::sync::Arc::new(|i: &PortInputs| i.tensor(0).zeros_like()),
            None,
        ),
        (
            Layer::function("h_softmax_naive", "zoo_ref.softmax")
                .dim("b", 1, 4)
                .dim("n", 1, 64)
                .arg("x", ["b", "n"], Dist::default()),
            std::sync::Arc::new(|i: &PortInputs| {
                let e = i.tensor(0).exp()?;
                e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
            }),
            None,
        ),
    ]
}
