//! The kinds of check golden runs on a layer, and the options each declares: `grad(...)` and
//! `overfit(...)` in the attribute.

use crate::describe::numbers::num;
use candle_core::backprop::GradStore;
use candle_core::Var;
use candle_nn::optim::ParamsAdamW;
use serde_json::{json, Value as Json};
use std::fmt;
use std::sync::Arc;

/// The kinds of check golden runs on a layer; each has its own test, store and snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The port's outputs against the reference's.
    Forward,
    /// The port's gradients against finite differences and against PyTorch's autograd.
    Gradients,
    /// Training on one batch, against PyTorch's training.
    Overfit,
}

impl Kind {
    /// The test function the attribute generates for it.
    pub fn test(self) -> &'static str {
        match self {
            Kind::Forward => "matches_reference",
            Kind::Gradients => "gradients",
            Kind::Overfit => "overfits_single_batch",
        }
    }

    /// The kind's name in results files and failure artifacts: `forward`, `gradients`,
    /// `overfit`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Forward => "forward",
            Kind::Gradients => "gradients",
            Kind::Overfit => "overfit",
        }
    }

    /// What the check's snapshot, store and results file add to the check's name.
    pub fn suffix(self) -> &'static str {
        match self {
            Kind::Forward => "",
            Kind::Gradients => "__gradients",
            Kind::Overfit => "__overfit",
        }
    }
}

/// How the port's gradients are compared with finite differences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradMode {
    /// One directional derivative per input; the Jacobian only where that fails.
    Fast,
    /// Every Jacobian, element by element (small layers).
    Full,
}

/// The options of `grad(...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct GradSpec {
    /// Inputs and (module form) parameters to differentiate, by name; `None`: every float input
    /// and every parameter.
    pub wrt: Option<Vec<String>>,
    /// Finite-difference step (float64).
    pub eps: f64,
    /// Absolute tolerance of the finite-difference comparison.
    pub atol: f64,
    /// Relative tolerance of the finite-difference comparison.
    pub rtol: f64,
    /// Fast or full.
    pub mode: GradMode,
    /// Generated cases per dtype.
    pub cases: u32,
}

impl Default for GradSpec {
    /// torch.autograd.gradcheck's defaults (eps 1e-6, atol 1e-5, rtol 1e-3), fast mode, 8 cases.
    fn default() -> Self {
        GradSpec {
            wrt: None,
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
            mode: GradMode::Fast,
            cases: 8,
        }
    }
}

impl GradSpec {
    pub(crate) fn describe(&self) -> String {
        let wrt = self
            .wrt
            .as_ref()
            .map_or("every float input and parameter".to_string(), |w| {
                format!("{w:?}")
            });
        let mode = match self.mode {
            GradMode::Fast => "fast",
            GradMode::Full => "full",
        };
        format!(
            "gradients: wrt {wrt}; finite differences in f64, {mode} mode, eps {}, atol {}, rtol {}; {} cases",
            num(self.eps),
            num(self.atol),
            num(self.rtol),
            self.cases
        )
    }
}

/// The loss of the overfit check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Mean squared error against a standard-normal target of the output's shape.
    Mse,
    /// Cross-entropy of the output's last axis (logits) against random class ids.
    CrossEntropy,
}

/// A hand-written optimizer step: the parameters by name and their gradients.
pub type Step = Arc<dyn Fn(&[(String, Var)], &GradStore) -> candle_core::Result<()> + Send + Sync>;

/// The optimizer of the overfit check.
#[derive(Clone)]
pub enum Optimizer {
    /// candle-nn's SGD (no momentum), like `torch.optim.SGD(lr)`.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// candle-nn's AdamW, like `torch.optim.AdamW` with the same parameters.
    AdamW(ParamsAdamW),
    /// The port's own optimizer step, standing in for `like` (which PyTorch runs).
    Custom {
        /// What PyTorch runs for the parity comparison.
        like: Box<Optimizer>,
        /// The port's step.
        step: Step,
    },
}

impl fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl PartialEq for Optimizer {
    fn eq(&self, other: &Self) -> bool {
        self.describe() == other.describe()
    }
}

/// The learning rate of `optimizer = sgd` when `lr` is not given.
pub const DEFAULT_SGD_LR: f64 = 1e-2;

impl Optimizer {
    /// candle-nn's SGD with `lr` (default [`DEFAULT_SGD_LR`]).
    pub fn sgd(lr: Option<f64>) -> Self {
        Optimizer::Sgd {
            lr: lr.unwrap_or(DEFAULT_SGD_LR),
        }
    }

    /// candle-nn's AdamW with its defaults, and `lr` if given (default 1e-3).
    pub fn adamw(lr: Option<f64>) -> Self {
        let defaults = ParamsAdamW::default();
        Optimizer::AdamW(ParamsAdamW {
            lr: lr.unwrap_or(defaults.lr),
            ..defaults
        })
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Optimizer::Sgd { lr } => format!("sgd(lr = {})", num(*lr)),
            Optimizer::AdamW(p) => format!(
                "adamw(lr = {}, betas = ({}, {}), eps = {}, weight_decay = {})",
                num(p.lr),
                num(p.beta1),
                num(p.beta2),
                num(p.eps),
                num(p.weight_decay)
            ),
            Optimizer::Custom { like, .. } => {
                format!("the port's own step, like {}", like.describe())
            }
        }
    }

    /// What the worker runs.
    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Optimizer::Sgd { lr } => *lr,
            Optimizer::AdamW(p) => p.lr,
            Optimizer::Custom { like, .. } => like.lr(),
        }
    }

    pub(crate) fn to_json(&self) -> Json {
        match self {
            Optimizer::Sgd { lr } => json!({"kind": "sgd", "lr": lr}),
            Optimizer::AdamW(p) => json!({
                "kind": "adamw", "lr": p.lr, "beta1": p.beta1, "beta2": p.beta2,
                "eps": p.eps, "weight_decay": p.weight_decay,
            }),
            Optimizer::Custom { like, .. } => like.to_json(),
        }
    }
}

/// The options of `overfit(...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct OverfitSpec {
    /// Training steps.
    pub steps: u32,
    /// The loss.
    pub loss: Loss,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// The loss before the last step must be below `max(threshold, ratio × initial)`.
    pub ratio: f64,
    /// See `ratio`.
    pub threshold: f64,
}

impl Default for OverfitSpec {
    /// 200 steps of AdamW with candle-nn's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay
    /// 0.01) on the MSE; the loss must fall to a tenth, or below 1e-3.
    fn default() -> Self {
        OverfitSpec {
            steps: 200,
            loss: Loss::Mse,
            optimizer: Optimizer::AdamW(ParamsAdamW::default()),
            ratio: 0.1,
            threshold: 1e-3,
        }
    }
}

impl OverfitSpec {
    pub(crate) fn describe(&self, batch: &impl fmt::Display) -> String {
        let loss = match self.loss {
            Loss::Mse => "mse",
            Loss::CrossEntropy => "cross_entropy",
        };
        format!(
            "overfit: one batch ({batch}), loss {loss}, {}, {} steps; passes below max({}, {} × initial)",
            self.optimizer.describe(),
            self.steps,
            num(self.threshold),
            num(self.ratio)
        )
    }
}

/// How the port's training may differ from PyTorch's: the loss at each step, relatively. Measured
/// on the zoo (seeds 0..6): within 1e-5.
pub const PARITY_LOSS_RTOL: f64 = 1e-3;

/// How each parameter's total update (final − initial weights) may differ from PyTorch's, in norm
/// relative to PyTorch's, leaving out inert elements (AdamW normalises a gradient of pure rounding
/// noise to a step of ±lr, so those elements wander differently in any two implementations).
/// Measured on the zoo (seeds 0..6): within 1e-6 once inert elements are left out (3e-3..7e-3
/// with them).
pub const PARITY_UPDATE_RTOL: f64 = 1e-2;
