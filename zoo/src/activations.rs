//! Element-wise activations and softmax.

use candle_core::{DType, Result, Tensor, D};
use golden::golden_layer;

/// PyTorch's default GELU is the exact (erf) form; candle's `Tensor::gelu` is the tanh
/// approximation, so the faithful port is `gelu_erf`.
#[golden_layer(
    grad,
    reference = "zoo_ref.gelu",
    dims(b = 1..=4, n = 1..=256),
    args(x = [b, n]),
)]
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    x.gelu_erf()
}

/// The tanh approximation, checked in three dtypes with the same cases.
///
/// PyTorch evaluates half-precision GELU in f32 and rounds once. candle's `gelu` on a bf16 tensor
/// evaluates `0.5·x·(1 + tanh(…))` in bf16, where `1 + tanh(…)` cancels to 0 for x below about −3
/// (golden found this: reference −0.00229 at x = −π, port 0). The faithful port upcasts.
///
/// In f64 it writes the formula out: the backward of candle's `gelu` hard-codes its constants to 6
/// digits (0.797885 for √(2/π)), 2e-6 relative, which golden's gradient check found against
/// PyTorch's autograd (`tests/gradients.rs`).
#[golden_layer(
    grad,
    reference = "zoo_ref.gelu_tanh",
    dims(b = 1..=4, n = 1..=256),
    args(x = [b, n]),
    dtypes = [f32, bf16, f64],
)]
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::BF16 | DType::F16 => x.to_dtype(DType::F32)?.gelu()?.to_dtype(x.dtype()),
        DType::F64 => {
            let inner = ((x + (x.powf(3.0)? * 0.044715)?)? * (2.0 / std::f64::consts::PI).sqrt())?;
            (x * 0.5)? * (inner.tanh()? + 1.0)?
        }
        _ => x.gelu(),
    }
}

#[golden_layer(
    grad,
    reference = "zoo_ref.silu",
    dims(b = 1..=4, n = 1..=256),
    args(x = [b, n]),
)]
pub fn silu(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::silu(x)
}

/// Softmax over the last dim, through `ops::softmax` (differentiable; the fused
/// `softmax_last_dim` has no backward).
#[golden_layer(
    grad,
    reference = "zoo_ref.softmax",
    dims(b = 1..=4, t = 1..=16, n = 1..=128),
    args(x = [b, t, n]),
    invariants(out = [finite, non_negative, sums_to_one(dim = -1)]),
)]
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax(x, D::Minus1)
}
