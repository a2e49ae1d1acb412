//! Linear maps: a dense layer, an embedding lookup and a strided, padded 1-d convolution.

use candle_core::{Module, Result, Tensor};
use golden::golden_layer;

#[golden_layer(
    grad,
    reference = "zoo_ref.linear",
    dims(b = 1..=4, t = 1..=16, d_in = 1..=256, d_out = 1..=64),
    args(x = [b, t, d_in], weight = [d_out, d_in] ~ normal(0.0, 0.1), bias = [d_out]),
)]
pub fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    candle_nn::Linear::new(weight.clone(), Some(bias.clone())).forward(x)
}

/// Integer ids in, rows of the table out: compared exactly where the reference is exact.
#[golden_layer(
    grad,
    reference = "zoo_ref.embedding",
    dims(b = 1..=4, t = 1..=32, vocab = 1..=100, d = 1..=32),
    args(ids = [b, t] ~ int(0..vocab), weight = [vocab, d]),
)]
pub fn embedding(ids: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let d = weight.dim(1)?;
    candle_nn::Embedding::new(weight.clone(), d).forward(ids)
}

#[golden_layer(
    grad,
    reference = "zoo_ref.conv1d",
    dims(b = 1..=3, c_in = 1..=32, c_out = 1..=16, t = 5..=48, k = 1..=5),
    args(x = [b, c_in, t], weight = [c_out, c_in, k] ~ normal(0.0, 0.2), bias = [c_out]),
    consts(stride = 2, padding = 2),
)]
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    // Not `x.conv1d(..)`: with stride > 1, candle 0.11.1's conv1d backward computes a wrong weight
    // gradient (golden's gradient check found it; `tests/gradients.rs` keeps that port). The windows
    // are unfolded and multiplied instead, with ops whose backward is right.
    let (b, c_in, t) = x.dims3()?;
    let (c_out, _, k) = weight.dims3()?;
    let x = x.pad_with_zeros(2, padding, padding)?;
    let t_out = (t + 2 * padding - k) / stride + 1;
    let windows = (0..t_out)
        .map(|j| x.narrow(2, j * stride, k))
        .collect::<Result<Vec<_>>>()?;
    let cols = Tensor::stack(&windows, 2)? // [b, c_in, t_out, k]
        .permute((0, 2, 1, 3))?
        .reshape((b, t_out, c_in * k))?;
    let y = cols.broadcast_matmul(&weight.reshape((c_out, c_in * k))?.t()?)?; // [b, t_out, c_out]
    y.transpose(1, 2)?.broadcast_add(&bias.reshape((1, (), 1))?)
}

/// Logits soft-capped or not: the configuration is swept, each case draws one (`one_of`), and a
/// `None` among the alternatives makes the Rust parameter an `Option`.
#[golden_layer(
    reference = "zoo_ref.capped_logits",
    dims(b = 1..=2, t = 1..=8, d = 1..=32, vocab = 1..=48),
    args(x = [b, t, d], weight = [vocab, d]),
    consts(softcap = one_of(None, 30.0)),
)]
pub fn capped_logits(x: &Tensor, weight: &Tensor, softcap: Option<f64>) -> Result<Tensor> {
    let logits = x.broadcast_matmul(&weight.t()?)?;
    match softcap {
        Some(cap) => (logits / cap)?.tanh()? * cap,
        None => Ok(logits),
    }
}
