//! The small MLP of the overfit check's tests (`tests/overfit.rs`, and the HTML report's test):
//! `zoo_ref.MLP`, its candle port, and a hand-written SGD step. Their golden stores are shared, so
//! the descriptions must be.

use candle_core::{Module, Result, Tensor};
use candle_nn::{linear, VarBuilder};
use golden::internal::describe::checks::Step;
use golden::{DimExpr, Dist, Layer};
use golden::{Optimizer, OverfitSpec};
use std::sync::Arc;

pub const D: usize = 8;
pub const HIDDEN: usize = 16;
pub const LR: f64 = 0.05;

/// `zoo_ref.MLP` (Linear → GELU → Linear), small, trained with `optimizer` for 100 steps.
pub fn mlp_layer(name: &str, optimizer: Optimizer) -> Layer {
    Layer::module(name, "zoo_ref.MLP")
        .init("d_model", D)
        .init("hidden", HIDDEN)
        .dim("b", 2, 4)
        .arg("x", ["b".into(), DimExpr::Lit(D)], Dist::default())
        .overfit(OverfitSpec {
            steps: 100,
            optimizer,
            ..OverfitSpec::default()
        })
}

/// The port of `zoo_ref.MLP`; `detach` cuts the graph after the hidden layer.
pub fn mlp(vb: VarBuilder, x: &Tensor, detach: bool) -> Result<Tensor> {
    let fc1 = linear(D, HIDDEN, vb.pp("fc1"))?;
    let fc2 = linear(HIDDEN, D, vb.pp("fc2"))?;
    let hidden = fc1.forward(x)?.gelu_erf()?;
    fc2.forward(&if detach { hidden.detach() } else { hidden })
}

/// A hand-written SGD step `w ← w − sign · lr · g`, skipping the parameter named `skip`.
pub fn sgd_step(sign: f64, skip: Option<&'static str>) -> Step {
    Arc::new(move |vars, grads| {
        for (name, var) in vars {
            if Some(name.as_str()) == skip {
                continue;
            }
            if let Some(g) = grads.get(var.as_tensor()) {
                var.set(&(var.as_tensor() - (g * (sign * LR))?)?)?;
            }
        }
        Ok(())
    })
}

pub fn custom(step: Step) -> Optimizer {
    Optimizer::Custom {
        like: Box::new(Optimizer::sgd(Some(LR))),
        step,
    }
}
