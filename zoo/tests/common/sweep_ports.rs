//! Ports whose bugs live in one branch of a configuration (`tests/sweeps.rs`): each check sweeps the
//! configuration with `one_of(...)`, and the port reads the case's values (`PortInputs::value`) as
//! a port reads its `config.json`.
//!
//! - transformers' `LlamaAttention` with an explicit `head_dim` that is `hidden / heads` or twice
//!   that; the wrong port computes `hidden / heads` itself;
//! - transformers' `Gemma2ForCausalLM` (the porter's Gemma 2 port of `porter_ports.rs`, with its LM
//!   head) with the final logits soft-capped or not, and the head tied to the embedding or not; the
//!   wrong ports leave the soft-cap out, or read `lm_head.weight` whatever the configuration says.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use golden::{DimExpr, DimValue, Dist, Layer, PortInputs, Value};
use std::collections::BTreeMap;

use crate::common::porter_ports::{self, Gemma, G_HIDDEN, G_VOCAB};

fn dim(name: &str) -> Box<DimValue> {
    Box::new(DimValue::dim(name))
}

fn lit(n: i64) -> Box<DimValue> {
    Box::new(DimValue::Lit(n))
}

/// `2 * q * h`: the hidden size, a multiple of the heads `h` with an even head size.
fn hidden() -> DimValue {
    DimValue::Mul(Box::new(DimValue::Mul(lit(2), dim("q"))), dim("h"))
}

/// `LlamaAttention` built from a `LlamaConfig` whose `head_dim` is swept:
/// `one_of(2 * q * h / h, 4 * q * h / h)` — `hidden / heads`, and twice that.
pub fn llama_attention(name: &str) -> Layer {
    let head_dim = |k: i64| {
        Value::Dims(DimValue::Div(
            Box::new(DimValue::Mul(
                Box::new(DimValue::Mul(lit(k), dim("q"))),
                dim("h"),
            )),
            dim("h"),
        ))
    };
    Layer::module(
        name,
        "transformers.models.llama.modeling_llama.LlamaAttention",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", Value::Dims(hidden()))
    .config_value("num_attention_heads", Value::dim("h"))
    .config_value("num_key_value_heads", Value::dim("h"))
    .config_value("head_dim", Value::one_of([head_dim(2), head_dim(4)]))
    .config_value("max_position_embeddings", 64usize)
    .init("layer_idx", 0usize)
    .dim("b", 1, 2)
    .dim("t", 1, 5)
    .dim("h", 1, 2)
    .dim("q", 1, 3)
    .arg(
        "x",
        [DimExpr::from("b"), "t".into(), DimExpr::Expr(hidden())],
        Dist::default(),
    )
    .cases(12)
}

/// A port of `LlamaAttention` (no GQA, positions `0..t`, causal), its sizes from the case's
/// configuration; `head_dim_from_hidden` computes the head size as `hidden / heads`, as candle's
/// older ports do, instead of reading the configuration's `head_dim`.
pub fn attention(i: &PortInputs, head_dim_from_hidden: bool) -> Result<Tensor> {
    let int = |k: &str| i.value(k).and_then(Value::as_int).unwrap_or(0) as usize;
    let (hidden, heads) = (int("hidden_size"), int("num_attention_heads"));
    let head_dim = if head_dim_from_hidden {
        hidden / heads
    } else {
        int("head_dim")
    };
    let vb = i.var_builder();
    let x = i.tensor(0);
    let (b, t, _) = x.dims3()?;
    let w = |name: &str, out: usize, inp: usize| vb.get((out, inp), &format!("{name}.weight"));
    let split = |y: Tensor| -> Result<Tensor> {
        y.reshape((b, t, heads, head_dim))?
            .transpose(1, 2)?
            .contiguous()
    };
    let q = split(x.broadcast_matmul(&w("q_proj", heads * head_dim, hidden)?.t()?)?)?;
    let k = split(x.broadcast_matmul(&w("k_proj", heads * head_dim, hidden)?.t()?)?)?;
    let v = split(x.broadcast_matmul(&w("v_proj", heads * head_dim, hidden)?.t()?)?)?;
    let (cos, sin) = rope_tables(t, head_dim, x.device())?;
    let rotate = |z: &Tensor| -> Result<Tensor> {
        let half = head_dim / 2;
        let rotated = Tensor::cat(
            &[
                &z.narrow(D::Minus1, half, half)?.neg()?,
                &z.narrow(D::Minus1, 0, half)?,
            ],
            D::Minus1,
        )?;
        z.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
    };
    let (q, k) = (rotate(&q)?, rotate(&k)?);
    let scores = (q.matmul(&k.t()?)? * (head_dim as f64).powf(-0.5))?;
    let scores = scores.broadcast_add(&super::causal_mask(t, x.device())?)?;
    let y = candle_nn::ops::softmax_last_dim(&scores)?
        .matmul(&v)?
        .transpose(1, 2)?
        .reshape((b, t, heads * head_dim))?;
    y.broadcast_matmul(&w("o_proj", hidden, heads * head_dim)?.t()?)
}

/// [`attention`] as the check's outputs: `LlamaAttention` returns (output, weights), its weights
/// `None` with sdpa, so `out.0`.
pub fn attention_outputs(
    i: &PortInputs,
    head_dim_from_hidden: bool,
) -> std::result::Result<golden::Outputs, String> {
    use golden::IntoOutputs;
    attention(i, head_dim_from_hidden)
        .map(|t| vec![t])
        .into_outputs()
}

/// cos and sin of positions `0..t`, `[t, head_dim]`, as Llama's rotary embedding computes them.
pub fn rope_tables(t: usize, head_dim: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..head_dim / 2)
        .map(|j| 1.0 / 10000f32.powf((2 * j) as f32 / head_dim as f32))
        .collect();
    let freqs: Vec<f32> = (0..t)
        .flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f))
        .collect();
    let freqs = Tensor::from_vec(freqs, (t, head_dim / 2), device)?;
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
    Ok((emb.cos()?, emb.sin()?))
}

/// `Gemma2ForCausalLM` (the Gemma 2 of `porter_ports.rs`, with its LM head), its final logits
/// soft-capped at 30 or not, and its LM head tied to the embedding or not.
pub fn gemma_lm(name: &str) -> Layer {
    let layer = porter_ports::gemma_layer(name)
        .config_value(
            "final_logit_softcapping",
            Value::one_of([Value::None, 30.0.into()]),
        )
        .config_value(
            "tie_word_embeddings",
            Value::one_of([true.into(), false.into()]),
        );
    layer.against("transformers.Gemma2ForCausalLM")
}

/// What a port of [`gemma_lm`] gets wrong.
#[derive(Clone, Copy, Default)]
pub struct LmBugs {
    /// The final logits' soft-cap `tanh(x / cap) · cap` left out.
    pub no_final_softcap: bool,
    /// The LM head read as `lm_head.weight` whatever `tie_word_embeddings` says.
    pub untied_head: bool,
}

/// The logits of [`gemma_lm`]'s port, as `out.logits`.
pub fn gemma_lm_port(i: &PortInputs, bugs: LmBugs) -> Result<BTreeMap<&'static str, Tensor>> {
    let vb = i.var_builder();
    let h = porter_ports::gemma_model(vb.pp("model"), i.tensor(0), Gemma::default())?;
    let tied = i.value("tie_word_embeddings").and_then(Value::as_bool) == Some(true);
    let head = if tied && !bugs.untied_head {
        vb.get((G_VOCAB, G_HIDDEN), "model.embed_tokens.weight")?
    } else {
        vb.get((G_VOCAB, G_HIDDEN), "lm_head.weight")?
    };
    let mut logits = candle_nn::Linear::new(head, None).forward(&h)?;
    if let Some(cap) = i
        .value("final_logit_softcapping")
        .and_then(Value::as_float)
        .filter(|_| !bugs.no_final_softcap)
    {
        logits = ((logits.to_dtype(DType::F32)? / cap)?.tanh()? * cap)?.to_dtype(h.dtype())?;
    }
    Ok(BTreeMap::from([("logits", logits)]))
}
