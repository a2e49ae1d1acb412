//! A candle port of `GPT2LMHeadModel` with a KV cache: learned absolute positions (where a row's
//! positions in a padded batch matter, unlike rotary models'), LayerNorm, `Conv1D` weights stored
//! `[in, out]`, the tanh GELU, an LM head tied to the token embedding. Driven through schedules by
//! `tests/schedules.rs`.

use crate::common::decoder::{allowed, Bugs};
use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;
use golden::{Decode, DimExpr, Dist, Layer, Step};

pub const VOCAB: usize = 32;
pub const EMBD: usize = 16;
pub const HEADS: usize = 4;
pub const LAYERS: usize = 2;
pub const POSITIONS: usize = 64;

/// The check of `GPT2LMHeadModel` through padded schedules.
pub fn gpt2(name: &str) -> Layer {
    Layer::module(name, "transformers.GPT2LMHeadModel")
        .config("transformers.GPT2Config")
        .config_value("vocab_size", VOCAB)
        .config_value("n_embd", EMBD)
        .config_value("n_layer", LAYERS)
        .config_value("n_head", HEADS)
        .config_value("n_positions", POSITIONS)
        .dim("b", 1, 3)
        .dim("n", 2, 8)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("n")],
            Dist::int(0, VOCAB as i64),
        )
        .decode(Decode {
            padding: true,
            ..Decode::over("input_ids")
        })
        .cases(12)
}

fn layer_norm(x: &Tensor, vb: &VarBuilder) -> Result<Tensor> {
    let (w, b) = (vb.get(EMBD, "weight")?, vb.get(EMBD, "bias")?);
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    centered
        .broadcast_div(&(var + 1e-5)?.sqrt()?)?
        .broadcast_mul(&w)?
        .broadcast_add(&b)
}

/// `Conv1D`: `x @ weight + bias`, weight `[in, out]`.
fn conv1d(x: &Tensor, vb: &VarBuilder, inp: usize, out: usize) -> Result<Tensor> {
    x.broadcast_matmul(&vb.get((inp, out), "weight")?)?
        .broadcast_add(&vb.get(out, "bias")?)
}

/// The model with its cache.
pub struct Gpt2 {
    vb: VarBuilder<'static>,
    cache: Vec<Option<(Tensor, Tensor)>>,
    bugs: Bugs,
}

impl Gpt2 {
    pub fn step(&mut self, step: &Step) -> Result<Tensor> {
        let t = self.vb.pp("transformer");
        let ids = step.input("input_ids")?;
        let (batch, len) = ids.dims2()?;
        let past = step.offset();
        let positions = if self.bugs.positions_ignore_padding {
            Tensor::arange(past as u32, (past + len) as u32, ids.device())?
                .unsqueeze(0)?
                .broadcast_as((batch, len))?
                .contiguous()?
        } else {
            step.positions().clone()
        };
        let wte = t.get((VOCAB, EMBD), "wte.weight")?;
        let wpe = t.get((POSITIONS, EMBD), "wpe.weight")?;
        let embed = |table: &Tensor, idx: &Tensor| -> Result<Tensor> {
            table
                .index_select(&idx.flatten_all()?, 0)?
                .reshape((batch, len, EMBD))
        };
        let mut h = (embed(&wte, ids)? + embed(&wpe, &positions)?)?;
        let mask = allowed(step, past, len, batch, None, self.bugs)?;
        let hd = EMBD / HEADS;
        for i in 0..LAYERS {
            let l = t.pp("h").pp(i);
            let x = layer_norm(&h, &l.pp("ln_1"))?;
            let qkv = conv1d(&x, &l.pp("attn").pp("c_attn"), EMBD, 3 * EMBD)?;
            let heads = |y: Tensor| -> Result<Tensor> {
                y.reshape((batch, len, HEADS, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = heads(qkv.narrow(2, 0, EMBD)?)?;
            let k = heads(qkv.narrow(2, EMBD, EMBD)?)?;
            let v = heads(qkv.narrow(2, 2 * EMBD, EMBD)?)?;
            let (k, v) = match self.cache[i].take() {
                Some((k0, v0)) => (Tensor::cat(&[&k0, &k], 2)?, Tensor::cat(&[&v0, &v], 2)?),
                None => (k, v),
            };
            self.cache[i] = Some((k.clone(), v.clone()));
            let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?;
            let floor = Tensor::full(f32::MIN, scores.shape(), scores.device())?;
            let scores = mask
                .broadcast_as(scores.shape())?
                .where_cond(&scores, &floor)?;
            let out = candle_nn::ops::softmax_last_dim(&scores)?
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((batch, len, EMBD))?;
            h = (h + conv1d(&out, &l.pp("attn").pp("c_proj"), EMBD, EMBD)?)?;
            let x = layer_norm(&h, &l.pp("ln_2"))?;
            let mlp = conv1d(&x, &l.pp("mlp").pp("c_fc"), EMBD, 4 * EMBD)?.gelu()?;
            h = (h + conv1d(&mlp, &l.pp("mlp").pp("c_proj"), 4 * EMBD, EMBD)?)?;
        }
        layer_norm(&h, &t.pp("ln_f"))?.broadcast_matmul(&wte.t()?)
    }
}

/// The port of [`gpt2`]'s check.
pub fn port(
    bugs: Bugs,
) -> impl Fn(&golden::PortInputs) -> std::result::Result<golden::Outputs, String>
       + Clone
       + Send
       + Sync
       + 'static {
    crate::common::stepping(
        "logits",
        move |vb| {
            Ok(Gpt2 {
                vb,
                cache: vec![None; LAYERS],
                bugs,
            })
        },
        Gpt2::step,
    )
}
