//! Wrong ports of the kinds golden's reach targets (configuration branches, half precision,
//! dtypes along a trace, declared invariants), written after the mechanism and not tuned to: each
//! test asserts what golden says on it, a miss included, and the right port passes. Live.

mod common;

use candle_core::{DType, Module, Result, Tensor, D};
use common::{must_fail, must_pass};
use golden::{DimExpr, Dist, Invariant, Layer, PortInputs, Value};

// --- Configuration branches -----------------------------------------------------------------------

/// `LlamaAttention` with two heads of 8, its key/value heads and its biases swept.
fn attention_layer(name: &str) -> Layer {
    Layer::module(
        name,
        "transformers.models.llama.modeling_llama.LlamaAttention",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", 16usize)
    .config_value("num_attention_heads", 2usize)
    .config_value("num_key_value_heads", Value::one_of([2.into(), 1.into()]))
    .config_value("attention_bias", Value::one_of([false.into(), true.into()]))
    .config_value("head_dim", 8usize)
    .config_value("max_position_embeddings", 64usize)
    .init("layer_idx", 0usize)
    .dim("b", 1, 2)
    .dim("t", 1, 5)
    .arg(
        "x",
        [DimExpr::from("b"), "t".into(), DimExpr::Lit(16)],
        Dist::default(),
    )
    .cases(12)
}

#[derive(Clone, Copy, Default)]
struct AttentionBugs {
    /// As many key/value heads as query heads, whatever `num_key_value_heads` says.
    no_gqa: bool,
    /// No biases, whatever `attention_bias` says.
    no_bias: bool,
}

fn attention(i: &PortInputs, bugs: AttentionBugs) -> Result<Tensor> {
    let vb = i.var_builder();
    let x = i.tensor(0);
    let (b, t, _) = x.dims3()?;
    let (heads, hd) = (2usize, 8usize);
    let kv = if bugs.no_gqa {
        heads
    } else {
        i.value("num_key_value_heads")
            .and_then(Value::as_int)
            .unwrap_or(2) as usize
    };
    let bias = !bugs.no_bias && i.value("attention_bias").and_then(Value::as_bool) == Some(true);
    let proj =
        |name: &str, out: usize, inp: usize| candle_nn::linear_b(inp, out, bias, vb.pp(name));
    let split = |y: Tensor, n: usize| -> Result<Tensor> {
        y.reshape((b, t, n, hd))?.transpose(1, 2)?.contiguous()
    };
    let q = split(proj("q_proj", heads * hd, 16)?.forward(x)?, heads)?;
    let k = split(proj("k_proj", kv * hd, 16)?.forward(x)?, kv)?;
    let v = split(proj("v_proj", kv * hd, 16)?.forward(x)?, kv)?;
    let (cos, sin) = common::sweep_ports::rope_tables(t, hd, x.device())?;
    let rotate = |z: &Tensor| -> Result<Tensor> {
        let rotated = Tensor::cat(
            &[
                &z.narrow(D::Minus1, hd / 2, hd / 2)?.neg()?,
                &z.narrow(D::Minus1, 0, hd / 2)?,
            ],
            D::Minus1,
        )?;
        z.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
    };
    let (q, k) = (rotate(&q)?, rotate(&k)?);
    let repeat = |z: Tensor| -> Result<Tensor> {
        z.unsqueeze(2)?
            .expand((b, kv, heads / kv, t, hd))?
            .reshape((b, heads, t, hd))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?;
    let scores = scores.broadcast_add(&common::causal_mask(t, x.device())?)?;
    let y = candle_nn::ops::softmax_last_dim(&scores)?
        .matmul(&v)?
        .transpose(1, 2)?
        .reshape((b, t, heads * hd))?;
    proj("o_proj", 16, heads * hd)?.forward(&y)
}

fn attention_outputs(
    i: &PortInputs,
    bugs: AttentionBugs,
) -> std::result::Result<golden::Outputs, String> {
    golden::IntoOutputs::into_outputs(attention(i, bugs).map(|t| vec![t]))
}

type Port = fn(&PortInputs) -> std::result::Result<golden::Outputs, String>;

/// The check of a port returning `Outputs`: the failure's message, or `None` when it passes.
fn check(layer: &Layer, port: Port) -> Option<String> {
    let scratch = common::Scratch::new(layer.name());
    golden::check(&common::declared_with_store(layer, &scratch), &port)
        .err()
        .map(|f| f.to_string())
}

#[test]
fn u1_key_value_heads_tiled_as_query_heads() {
    let msg = check(&attention_layer("u_no_gqa"), |i| {
        attention_outputs(
            i,
            AttentionBugs {
                no_gqa: true,
                ..Default::default()
            },
        )
    })
    .expect("wrong");
    println!("{msg}");
    // Named: the branch with one key/value head, and the projection of the wrong shape.
    assert!(
        msg.contains(
            "configuration: num_key_value_heads = 1, attention_bias = false; passed before"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the port asks for `k_proj.weight` with shape [16, 16]; the reference's is [8, 16]"
        ),
        "{msg}"
    );
    if let Some(f) = check(&attention_layer("u_attention_right"), |i| {
        attention_outputs(i, AttentionBugs::default())
    }) {
        panic!("the right port failed:\n{f}");
    }
}

#[test]
fn u2_attention_biases_ignored() {
    let msg = check(&attention_layer("u_no_bias"), |i| {
        attention_outputs(
            i,
            AttentionBugs {
                no_bias: true,
                ..Default::default()
            },
        )
    })
    .expect("wrong");
    println!("{msg}");
    // Named: the branch with biases, and each bias the port never reads.
    assert!(
        msg.contains("configuration: num_key_value_heads = 2, attention_bias = true"),
        "{msg}"
    );
    for name in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        let unread = format!(
            "the reference's state_dict has `{name}.bias` [16], which the port never reads"
        );
        assert!(msg.contains(&unread), "{msg}");
    }
}

/// `LlamaRMSNorm(hidden, eps)` with its eps swept.
fn rms_layer(name: &str) -> Layer {
    Layer::module(
        name,
        "transformers.models.llama.modeling_llama.LlamaRMSNorm",
    )
    .init("hidden_size", Value::dim("d"))
    .init("eps", Value::one_of([1e-6.into(), 1e-5.into()]))
    .dim("b", 1, 3)
    .dim("d", 1, 32)
    .arg("x", ["b", "d"], Dist::default())
}

fn rms(i: &PortInputs, eps: Option<f64>) -> Result<Tensor> {
    let eps = eps.unwrap_or_else(|| i.value("eps").and_then(Value::as_float).unwrap_or(1e-6));
    let x = i.tensor(0);
    let w = i.var_builder().get(i.dim("d"), "weight")?;
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    w.broadcast_mul(&x.broadcast_div(&(var + eps)?.sqrt()?)?)
}

#[test]
fn u3_an_eps_hard_coded_where_the_config_sweeps_it() {
    let msg = must_fail(&rms_layer("u_eps_hard_coded"), |i| rms(i, Some(1e-6))).to_string();
    println!("{msg}");
    // Named: the branch, the tiny inputs where an eps decides, and the reference's line.
    assert!(
        msg.contains("configuration: eps = 1e-5; passed before with eps=1e-6"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with Tensor.add with 1e-06 instead of \
             1e-05 at transformers/models/llama/modeling_llama.py:"
        ),
        "{msg}"
    );
    must_pass(&rms_layer("u_eps_right"), |i| rms(i, None));
}

// --- Half precision -------------------------------------------------------------------------------

/// The rotary tables with the frequencies rounded to the activations' dtype (`inv_freq` built
/// in the model's dtype), the positions exact.
fn rotary_frequencies_in_bf16(i: &PortInputs) -> std::result::Result<golden::Outputs, String> {
    let run = || -> Result<Vec<Tensor>> {
        let (x, ids) = (i.tensor(0), i.tensor(1));
        let inv_freq: Vec<f32> = (0..8)
            .map(|j| 1.0 / 10000f32.powf((2 * j) as f32 / 16.0))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, 1, 8), x.device())?
            .to_dtype(x.dtype())?
            .to_dtype(DType::F32)?;
        let freqs = ids
            .to_dtype(DType::F32)?
            .unsqueeze(2)?
            .broadcast_mul(&inv_freq)?;
        let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
        Ok(vec![
            emb.cos()?.to_dtype(x.dtype())?,
            emb.sin()?.to_dtype(x.dtype())?,
        ])
    };
    golden::IntoOutputs::into_outputs(run())
}

#[test]
fn u4_rotary_frequencies_rounded_to_bf16() {
    let msg = check(
        &common::rotary::llama_rotary("u_rope_freq_bf16", DType::BF16),
        rotary_frequencies_in_bf16,
    )
    .expect("wrong");
    println!("{msg}");
    // Caught far into the sequence, by a wide margin on `out.1`.
    assert!(msg.contains("leaf `out.1` (bf16 ["), "{msg}");
    assert!(
        msg.contains("where it differs most, `position_ids` is "),
        "{msg}"
    );
    assert!(
        msg.contains("the port is markedly less accurate than its reference"),
        "{msg}"
    );
}

/// Causal attention in bf16 (`zoo_ref.causal_attention`, PyTorch's sdpa).
fn sdpa_layer(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.causal_attention")
        .dim("b", 1, 2)
        .dim("h", 1, 4)
        .dim("t", 1, 32)
        .dim("d", 1, 64)
        .arg("q", ["b", "h", "t", "d"], Dist::default())
        .arg("k", ["b", "h", "t", "d"], Dist::default())
        .arg("v", ["b", "h", "t", "d"], Dist::default())
        .dtypes(&[DType::BF16])
}

#[test]
fn u5_an_attention_s_softmax_computed_in_bf16() {
    // The zoo's port, everything in the input's dtype: scores, mask, softmax, the product.
    let msg = must_fail(&sdpa_layer("u_sdpa_softmax_bf16"), |i| {
        golden_zoo::attention::causal_attention(
            i.tensor(0),
            i.tensor(1),
            i.tensor(2),
            i.dim("t"),
            i.dim("d"),
        )
    })
    .to_string();
    println!("{msg}");
    // Caught by the error its rows share, near the rule's edge: a softmax in bf16 over a few
    // keys is one more rounding of each row's sum.
    assert!(
        msg.contains("the port is markedly less accurate than its reference along axis 3"),
        "{msg}"
    );
}

// --- Dtypes along the trace -----------------------------------------------------------------------

#[test]
fn u6_rotary_and_attention_in_f32_inside_a_bf16_layer() {
    let port = common::llama::Port {
        tap_rotary: true,
        rotary_in_f32: true,
        ..common::llama::Port::default()
    };
    let layer = common::llama::decoder_layer("u_llama_bf16_rotary_f32").dtypes(&[DType::BF16]);
    let msg = must_fail(&layer, move |i| {
        common::llama::decoder(i.var_builder(), i.tensor(0), port)
    })
    .to_string();
    println!("{msg}");
    // Named where the float32 starts: the rotated queries, the reference's own tap.
    assert!(
        msg.contains("leaves its reference `llama_ref.DecoderLayer` at `q_rot`")
            && msg.contains("trace point `q_rot`: the port computes it in f32 ["),
        "{msg}"
    );
}

// --- Declared invariants --------------------------------------------------------------------------

fn top_k_layer(name: &str) -> Layer {
    Layer::function(name, "reach_ref.top_k_probs")
        .konst("k", 3)
        .dim("b", 1, 3)
        .dim("n", 3, 12)
        .arg("logits", ["b", "n"], Dist::default())
        .invariant("out", Invariant::NonNegative)
        .invariant("out", Invariant::sums_to_one(-1))
}

/// The top 3 of each row kept; `renormalise` false leaves them as they were in the full softmax.
fn top_k(i: &PortInputs, renormalise: bool) -> Result<Tensor> {
    let x = i.tensor(0);
    let probs = candle_nn::ops::softmax_last_dim(x)?;
    let sorted = x.sort_last_dim(false)?.0;
    let kth = sorted.narrow(D::Minus1, 2, 1)?;
    let keep = x.broadcast_ge(&kth)?.to_dtype(DType::F32)?;
    let kept = (probs * keep)?;
    if renormalise {
        kept.broadcast_div(&kept.sum_keepdim(D::Minus1)?)
    } else {
        Ok(kept)
    }
}

#[test]
fn u7_a_top_k_sampler_that_forgets_to_renormalise() {
    let msg = must_fail(&top_k_layer("u_top_k_unnormalised"), |i| top_k(i, false)).to_string();
    println!("{msg}");
    assert!(
        msg.contains("breaks the invariant `sums_to_one(dim = -1)` declared for its output `out`")
            && msg.contains("the reference holds it on this case (there it sums to 1)"),
        "{msg}"
    );
    must_pass(&top_k_layer("u_top_k_right"), |i| top_k(i, true));
}
