//! The overfit check: `#[golden_layer(overfit(...))]` (module form) generates
//! `#[test] fn overfits_single_batch()`.
//!
//! One fixed batch (each dim at the middle of its range, declared values, the layer's seed) and a
//! target of each output's shape (or class ids, for cross-entropy); golden trains the port on it
//! for `steps` steps with candle-nn's optimizer, and PyTorch trains the reference module the same
//! way from the same weights. The check fails when
//!
//! * the port does not overfit: its loss before the last step is not below
//!   `max(threshold, ratio × initial loss)` (the message shows the loss curve);
//! * a parameter is never updated (its optimizer never sees it, or no gradient reaches it);
//! * the two trainings part: the loss differs from PyTorch's at some step (the first such step is
//!   reported) or the final weights differ.
//!
//! Gradient health is reported too, per parameter over the steps: vanishing (norm below 1e-7 at
//! every step), exploding (above 1e3 at some step), and dead units (rows whose gradient is zero at
//! every step: a ReLU that never fires). Both sides run in eval mode: dropout would make them differ
//! by design.

use crate::answers::live::{Named, Request};
use crate::answers::source::{Answer, Source};
use crate::describe::checks::{Kind, Loss, Optimizer, OverfitSpec, Step};
use crate::describe::inputs::{self, CaseParams, Rng, Style};
use crate::describe::layer::dtype_name;
use crate::describe::layer::{Form, Layer};
use crate::describe::numbers::num;
use crate::python::worker::WorkerError;
use crate::report::failure::{CaseFailure, Failure, FailureKind, PortFault};
use crate::report::issues::TrainingIssue;
use crate::report::passed::{CaseRecord, DTypeRun, Note, Report};
use crate::report::results;
use crate::run::check::{self, Port};
use crate::run::forward::call_port;
use crate::run::port::{catching, PanicScope, PortThread};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::optim::{AdamW, Optimizer as _, SGD};
use golden_files::{HostTensor, WireDType};
use std::time::Instant;

use crate::describe::checks::{PARITY_LOSS_RTOL, PARITY_UPDATE_RTOL};

/// When PyTorch itself does not overfit, it trains this many times as long (at most
/// [`PROBE_MAX_STEPS`]) to find how many steps it needs.
const PROBE_FACTOR: u32 = 10;
/// See [`PROBE_FACTOR`].
const PROBE_MAX_STEPS: u32 = 5000;

/// The steps to suggest when PyTorch needs `needed`: a margin of a fifth, rounded up to a round
/// number.
fn suggested_steps(needed: u32) -> u32 {
    let with_margin = needed + needed / 5 + 1;
    let unit = if with_margin > 1000 { 100 } else { 10 };
    with_margin.div_ceil(unit) * unit
}

/// Per parameter, `‖Δport − Δtorch‖ / ‖Δtorch‖` over its elements that are not inert, where Δ is
/// the total update of the weights.
fn update_parity(training: &Training, torch: &Named) -> Vec<(String, f64)> {
    let initial = training.initial.iter();
    initial
        .zip(&training.final_weights)
        .zip(&training.grads)
        .map(|(((name, before), (_, after)), grads)| {
            let torch_after = torch
                .iter()
                .find(|(n, _)| n.strip_prefix("final.") == Some(name))
                .map(|(_, t)| t.to_f64());
            let Some(torch_after) = torch_after.filter(|t| t.len() == before.numel()) else {
                return (name.clone(), f64::NAN);
            };
            let (mut diff, mut norm) = (0.0, 0.0);
            let elements = before
                .to_f64()
                .into_iter()
                .zip(after.to_f64())
                .zip(torch_after);
            for (((b, a), t), inert) in elements.zip(grads.inert()) {
                if !inert {
                    diff += ((a - b) - (t - b)).powi(2);
                    norm += (t - b).powi(2);
                }
            }
            let rel = if diff == 0.0 {
                0.0
            } else if norm == 0.0 {
                f64::INFINITY
            } else {
                (diff / norm).sqrt()
            };
            (name.clone(), rel)
        })
        .collect()
}

/// The fixed batch: every dim at the middle of its range, declared values, the layer's seed, and
/// every swept value at its first alternative.
fn batch(layer: &Layer, seed: u64) -> CaseParams {
    CaseParams {
        dims: layer
            .dims
            .iter()
            .map(|d| (d.name.clone(), (d.lo + d.hi).div_ceil(2)))
            .collect(),
        seed: seed ^ inputs::fnv1a(layer.name.as_bytes()),
        style: Style::Declared,
        steps: None,
        config: layer
            .sweeps()
            .into_iter()
            .map(|(field, _)| layer.pick(field, 0))
            .collect(),
    }
}

fn target_for(loss: Loss, name: &str, out: &HostTensor, seed: u64, dtype: DType) -> HostTensor {
    let mut rng = Rng::new(seed, &format!("target.{name}"));
    match loss {
        Loss::Mse => inputs::float_tensor(out.shape.clone(), &rng.normals(out.numel()), dtype),
        Loss::CrossEntropy => {
            let classes = *out.shape.last().unwrap_or(&1) as u64;
            let shape = out.shape[..out.shape.len().saturating_sub(1)].to_vec();
            let n: usize = shape.iter().product();
            let data: Vec<u8> = (0..n)
                .flat_map(|_| (rng.below(classes.max(1)) as i64).to_le_bytes())
                .collect();
            HostTensor {
                dtype: WireDType::I64,
                shape,
                data: data.into(),
            }
        }
    }
}

/// The loss of the port's outputs, summed over leaves (as the worker computes it).
fn loss_of(
    loss: Loss,
    outputs: &crate::describe::outputs::Outputs,
    targets: &[(String, Tensor)],
) -> candle_core::Result<Tensor> {
    let mut total: Option<Tensor> = None;
    for (name, target) in targets {
        let out = outputs.leaf(name).map_err(candle_core::Error::Msg)?;
        let l = match loss {
            Loss::Mse => out.sub(&target.to_dtype(out.dtype())?)?.sqr()?.mean_all()?,
            Loss::CrossEntropy => {
                let classes = out.dim(D::Minus1)?;
                let logits = out.reshape(((), classes))?;
                let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
                let ids = target.flatten_all()?.unsqueeze(1)?;
                log_probs.gather(&ids, 1)?.neg()?.mean_all()?
            }
        };
        total = Some(match total {
            Some(t) => (t + l)?,
            None => l,
        });
    }
    total.ok_or_else(|| candle_core::Error::Msg("no output to train".into()))
}

/// What the port's training did.
struct Training {
    losses: Vec<f64>,
    grads: Vec<ParamGrads>,
    initial: Named,
    final_weights: Named,
    /// The parameters the port never read (no gradient can reach them: not a detach).
    never_read: Vec<String>,
}

/// One parameter's gradients over the training, for the health flags.
struct ParamGrads {
    name: String,
    /// The gradient's norm at each step (0 when it got none).
    norms: Vec<f64>,
    /// Per element, the largest |gradient| over the steps.
    max_abs: Vec<f64>,
    /// Elements per row (first axis).
    row: usize,
    /// PyTorch's gradient of the training loss at the initial weights, per element: in the case
    /// dtype and in float64 (its upcasts promoted); `None` where PyTorch could not give it (a
    /// float64 case, a replay of a store recorded without it).
    reference: Option<(Vec<f64>, Vec<f64>)>,
}

/// An element whose gradient never exceeds this fraction of its tensor's largest is inert: its
/// gradient is zero in exact arithmetic (a key bias under softmax) and rounding noise in practice.
const INERT_FRACTION: f64 = 1e-5;

/// An element is inert too when PyTorch's gradient of the training loss at the initial weights is,
/// in float64, at most this fraction of what it is in the case dtype: rounding noise shrinks with
/// the precision (by ~2^-29 from float32 to float64), a gradient does not. This finds a tensor that
/// is all noise — a separate key bias, which [`INERT_FRACTION`] cannot, its tensor having no real
/// gradient to compare with. (PyTorch's, not the port's: a faithful port computes its softmax in
/// float32 whatever its input, and so would carry float32's noise into a float64 run.)
const INERT_FLOAT64_RATIO: f64 = 1e-4;

impl ParamGrads {
    /// Rows whose gradient was exactly zero at every step, when some rows did get one.
    fn dead_rows(&self) -> Vec<usize> {
        let rows: Vec<bool> = self
            .max_abs
            .chunks(self.row.max(1))
            .map(|r| r.iter().all(|g| *g == 0.0))
            .collect();
        if rows.len() < 2 || rows.iter().all(|d| *d) {
            return Vec::new();
        }
        rows.iter()
            .enumerate()
            .filter_map(|(i, d)| d.then_some(i))
            .collect()
    }

    /// Elements that got only rounding noise (see [`INERT_FRACTION`] and
    /// [`INERT_FLOAT64_RATIO`]).
    fn inert(&self) -> Vec<bool> {
        let largest = self.max_abs.iter().copied().fold(0.0f64, f64::max);
        // Only a finite scale says what noise is (a diverging training has infinite gradients).
        let finite = largest.is_finite() && self.max_abs.iter().all(|g| g.is_finite());
        (0..self.max_abs.len())
            .map(|i| {
                let g = self.max_abs[i];
                let relative = g > 0.0 && g <= INERT_FRACTION * largest;
                // The noise's size: PyTorch's case-dtype gradient there, or the port's largest over
                // the steps where that one happened to round to zero.
                let shrinks = self.reference.as_ref().is_some_and(|(low, high)| {
                    let (noise, g64) = (low[i].abs().max(g), high[i].abs());
                    noise > 0.0 && g64.is_finite() && g64 <= INERT_FLOAT64_RATIO * noise
                });
                finite && (relative || shrinks)
            })
            .collect()
    }
}

/// What both trainings start from.
struct Batch<'a> {
    args: &'a [HostTensor],
    /// The reference module's initial state_dict, which of its entries are buffers, and which
    /// names are tied.
    state_dict: &'a Named,
    buffers: &'a [String],
    aliases: &'a [Vec<String>],
    /// `rename(...)`: the port's names for the reference's.
    rename: &'a [(String, String)],
    targets: &'a Named,
    dtype: DType,
}

/// Train the port. Its calls, the backward passes through its graph and the optimizer steps run
/// on the port's thread, each bounded by the timeout; their failures are also `port`'s fault.
fn train_port(
    port: &PortThread,
    spec: &OverfitSpec,
    batch: &Batch<'_>,
) -> Result<Training, String> {
    let Batch {
        args,
        state_dict,
        buffers,
        aliases,
        rename,
        targets,
        dtype,
    } = *batch;
    let device = Device::Cpu;
    let state =
        crate::answers::params::StateDict::serve(state_dict, aliases, rename, dtype, &device)
            .map_err(|e| e.to_string())?;
    // Every trained tensor once (a tied group under its first name, as PyTorch's optimizer sees
    // it), by the reference's names.
    let vars: Vec<(String, Var)> = state
        .vars()
        .into_iter()
        .filter(|(n, _)| !buffers.contains(n))
        .collect();
    let inputs: Vec<Tensor> = args
        .iter()
        .map(|a| a.to_candle(&device))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let targets: Vec<(String, Tensor)> = targets
        .iter()
        .map(|(n, t)| t.to_candle(&device).map(|t| (n.clone(), t)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let plain: Vec<Var> = vars.iter().map(|(_, v)| v.clone()).collect();
    enum Opt {
        Sgd(SGD),
        AdamW(AdamW),
        Custom(Step),
    }
    let mut opt = match &spec.optimizer {
        Optimizer::Sgd { lr } => Opt::Sgd(SGD::new(plain, *lr).map_err(|e| e.to_string())?),
        Optimizer::AdamW(p) => Opt::AdamW(AdamW::new(plain, p.clone()).map_err(|e| e.to_string())?),
        Optimizer::Custom { step, .. } => Opt::Custom(step.clone()),
    };
    let snapshot = |vars: &[(String, Var)]| -> Result<Named, String> {
        vars.iter()
            .map(|(n, v)| HostTensor::from_candle(v.as_tensor()).map(|t| (n.clone(), t)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())
    };
    let initial = snapshot(&vars)?;
    let mut losses = Vec::new();
    let mut param_grads: Vec<ParamGrads> = vars
        .iter()
        .map(|(n, v)| ParamGrads {
            name: n.clone(),
            norms: Vec::new(),
            max_abs: vec![0.0; v.elem_count()],
            row: v.dims().iter().skip(1).product(),
            reference: None,
        })
        .collect();
    for step in 0..spec.steps {
        let (outputs, _) = call_port(port, inputs.clone(), Some(&state), false, None)
            .map_err(|f| format!("the port failed while training: {}", f.message))?;
        let value = loss_of(spec.loss, &outputs, &targets).map_err(|e| format!("the loss: {e}"))?;
        losses.push(
            value
                .to_dtype(DType::F64)
                .and_then(|v| v.to_scalar::<f64>())
                .map_err(|e| e.to_string())?,
        );
        let loss = value.clone();
        let during = format!("the backward pass of training step {step}");
        let grads = port
            .run(&during, move || loss.backward())
            .map_err(|f| f.message)?
            .map_err(|e| format!("backward: {e}"))?;
        for ((_, var), p) in vars.iter().zip(param_grads.iter_mut()) {
            match grads.get(var.as_tensor()) {
                Some(g) => {
                    let g = HostTensor::from_candle(g)
                        .map_err(|e| e.to_string())?
                        .to_f64();
                    p.norms.push(g.iter().map(|x| x * x).sum::<f64>().sqrt());
                    for (m, x) in p.max_abs.iter_mut().zip(&g) {
                        *m = m.max(x.abs());
                    }
                }
                None => p.norms.push(0.0),
            }
        }
        let during = format!("the optimizer step of training step {step}");
        let stepping = vars.clone();
        let (stepped, result) = port
            .run(&during, move || {
                let result = match &mut opt {
                    Opt::Sgd(o) => o.step(&grads),
                    Opt::AdamW(o) => o.step(&grads),
                    Opt::Custom(step) => step(&stepping, &grads),
                };
                (opt, result)
            })
            .map_err(|f| f.message)?;
        opt = stepped;
        result.map_err(|e| format!("the optimizer step: {e}"))?;
    }
    Ok(Training {
        losses,
        grads: param_grads,
        initial,
        final_weights: snapshot(&vars)?,
        never_read: state.unused_names(),
    })
}

/// The derivative of the training loss with respect to each output, at the reference's initial
/// outputs: the cotangent whose vector-Jacobian product is the loss's gradient. MSE:
/// `2 (out − target) / n`; cross-entropy over the last axis: `(softmax(out) − onehot) / rows`.
fn loss_cotangent(loss: Loss, out: &HostTensor, target: &HostTensor, dtype: DType) -> HostTensor {
    let o = out.to_f64();
    let values: Vec<f64> = match loss {
        Loss::Mse => {
            let t = target.to_f64();
            let n = o.len().max(1) as f64;
            o.iter().zip(&t).map(|(o, t)| 2.0 * (o - t) / n).collect()
        }
        Loss::CrossEntropy => {
            let classes = (*out.shape.last().unwrap_or(&1)).max(1);
            let ids = target.to_i64();
            let rows = (o.len() / classes).max(1) as f64;
            o.chunks(classes)
                .zip(&ids)
                .flat_map(|(row, &id)| {
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
                    row.iter()
                        .enumerate()
                        .map(move |(k, x)| {
                            let p = (x - max).exp() / sum;
                            (p - if k as i64 == id { 1.0 } else { 0.0 }) / rows
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        }
    };
    inputs::float_tensor(out.shape.clone(), &values, dtype)
}

/// PyTorch's gradient of the training loss with respect to the module's parameters at the initial
/// weights, in the case dtype and in float64 (a gradient request with the loss's cotangents);
/// `None` when it cannot be had — best effort: it only tells rounding noise from gradients.
#[allow(clippy::too_many_arguments)]
fn reference_gradients(
    source: &Source,
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    spec: &OverfitSpec,
    args: &[HostTensor],
    forward: &crate::answers::live::ReferenceOutputs,
    targets: &Named,
) -> Option<crate::answers::live::ReferenceOutputs> {
    let cotangents: Vec<HostTensor> = forward
        .expected
        .iter()
        .map(|(name, out)| {
            let target = targets.iter().find(|(n, _)| n == name).map(|(_, t)| t)?;
            Some(loss_cotangent(spec.loss, out, target, dtype))
        })
        .collect::<Option<_>>()?;
    let names: Vec<String> = layer.args.iter().map(|a| a.name.clone()).collect();
    let request = Request::Gradients {
        args,
        cotangents: &cotangents,
        names: &names,
        wrt: &[],
        params: true,
        along: None,
    };
    match source.request(layer, dtype, params, &request) {
        Answer::Outputs(o) => Some(o),
        _ => None,
    }
}

/// The loss at a few steps, and the first step where it stopped being finite.
fn curve(losses: &[f64]) -> String {
    let n = losses.len();
    let blew_up = losses.iter().position(|l| !l.is_finite());
    let mut steps: Vec<usize> = [0, n / 10, n / 4, n / 2, 3 * n / 4]
        .into_iter()
        .chain(blew_up)
        .filter(|s| *s < n)
        .collect();
    if n > 0 {
        steps.push(n - 1);
    }
    steps.sort_unstable();
    steps.dedup();
    let mut text = steps
        .iter()
        .map(|&s| format!("step {s}: {}", num(losses[s])))
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(s) = blew_up {
        text.push_str(&format!(" (first not finite at step {s})"));
    }
    text
}

/// Run the overfit check (the layer's `overfit` options, or the defaults).
pub fn check(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    // A model that keeps state trains on whole sequences: one forward of the batch.
    let layer = &layer.without_schedule();
    let started = Instant::now();
    let mut description = String::new();
    let result = check_inner(layer, port, &mut description).map_err(|mut f| {
        f.check = Kind::Overfit;
        f
    });
    results::record(
        layer,
        Kind::Overfit,
        &description,
        &result,
        started.elapsed(),
    );
    result
}

/// The check; `described` gets what it is about as soon as that is known (for the results file,
/// a failure's too).
fn check_inner(layer: &Layer, port: &Port<'_>, described: &mut String) -> Result<Report, Failure> {
    let config_error = |m: String| Failure::new(layer, FailureKind::Config(m));
    layer.validate().map_err(config_error)?;
    let _quiet = PanicScope::enter();
    if layer.timeout.is_none() {
        // The port's timeout as well as the reference's.
        crate::describe::env::timeout().map_err(config_error)?;
    }
    crate::describe::env::check_all().map_err(config_error)?;
    let port = PortThread::of(port, layer);
    if layer.form != Form::Module {
        return Err(config_error(
            "the overfit check trains a module: its port takes a VarBuilder (module form)".into(),
        ));
    }
    let spec = layer.overfit.clone().unwrap_or_default();
    let seed = crate::describe::env::seed()
        .map_err(config_error)?
        .unwrap_or(0);
    let params = batch(layer, seed);
    let dtype = layer.dtypes[0];
    let description = format!("{}{}\n", layer.description(1, seed), spec.describe(&params));
    described.clone_from(&description);
    let mode = match layer.mode {
        Some(m) => m,
        None => crate::describe::env::mode().map_err(config_error)?,
    };
    let (source, how) = check::open_source(layer, Kind::Overfit, mode, &description)?;
    // The port's own code is caught on its thread; this catches what golden's training code
    // around it might raise, so that no panic escapes the check.
    let result = catching(|| run(layer, &port, &spec, &source, &params, dtype, true))
        .unwrap_or_else(|message| {
            let mut f = Failure::new(
                layer,
                FailureKind::Case(Box::new(CaseFailure {
                    port: Some(PortFault::Panicked(format!(
                        "{message} (while golden trained the port, outside the port's own calls: \
                         the backtrace printed with RUST_BACKTRACE=1 shows where)"
                    ))),
                    ..CaseFailure::default()
                })),
            );
            f.dtype = Some(dtype_name(dtype));
            f.case = Some(params.clone());
            Err(f)
        });
    check::finish_source(layer, Kind::Overfit, &source, &description)?;
    let (record, health) = result?;
    Ok(Report {
        layer: layer.clone(),
        kind: Kind::Overfit,
        description,
        seed,
        cases: 1,
        overridden: crate::describe::env::seed().ok().flatten().is_some(),
        source: how,
        runs: vec![DTypeRun {
            dtype,
            cases: vec![record],
            replayed: Vec::new(),
            skipped: 0,
            budgeted: None,
        }],
        health,
        store: crate::answers::store::path(layer, Kind::Overfit.suffix())
            .and_then(|p| crate::answers::store::stamp(&p)),
        recorded: matches!(source.via, crate::answers::source::Via::Record(..)),
        params: source.param_notes(layer),
        speed: Vec::new(),
    })
}

/// Train the port and PyTorch on the batch for `spec.steps` and judge the port. `probe`: when
/// PyTorch itself does not reach the bound and the port trains like it, learn how many steps
/// PyTorch needs and judge the port over those (`false` for that longer run itself).
fn run(
    layer: &Layer,
    port: &PortThread,
    spec: &OverfitSpec,
    source: &Source,
    params: &CaseParams,
    dtype: DType,
    probe: bool,
) -> Result<(CaseRecord, Vec<String>), Failure> {
    let failure = |kind| {
        let mut f = Failure::new(layer, kind);
        f.dtype = Some(dtype_name(dtype));
        f.case = Some(params.clone());
        f
    };
    let ask = |request: &Request<'_>| match source.request(layer, dtype, params, request) {
        Answer::Outputs(o) => Ok(o),
        Answer::Unrecorded => Err(failure(FailureKind::Config(format!(
            "the golden store has no training for this batch ({params}): it is out of date; record \
             it again (needs Python with torch): {}",
            layer.rerun_command(Kind::Overfit.test(), "GOLDEN_MODE=record")
        )))),
        Answer::Failed(e @ WorkerError::Remote(_)) => {
            Err(failure(FailureKind::Case(Box::new(CaseFailure {
                reference_error: Some(e),
                ..CaseFailure::default()
            }))))
        }
        Answer::Failed(e) => Err(failure(FailureKind::Worker(e))),
    };
    let args =
        inputs::make_args(layer, params, dtype).map_err(|e| failure(FailureKind::Config(e)))?;
    let forward = ask(&Request::Forward {
        args: &args,
        trace: false,
        twice: false,
        precise: false,
        plan: None,
        stage: None,
    })?;
    let elements = forward
        .expected
        .iter()
        .map(|(_, t)| inputs::elements(&t.shape))
        .sum();
    inputs::within_budget(elements, || {
        (
            format!(
                "the training targets for the reference's outputs ({elements} elements) are too \
                 large"
            ),
            "make the outputs smaller (narrow the dims)".to_string(),
        )
    })
    .map_err(|e| failure(FailureKind::Config(e)))?;
    let targets: Named = forward
        .expected
        .iter()
        .map(|(n, t)| (n.clone(), target_for(spec.loss, n, t, params.seed, dtype)))
        .collect();
    let target_tensors: Vec<HostTensor> = targets.iter().map(|(_, t)| t.clone()).collect();
    let optimizer = spec.optimizer.to_json();
    let loss_name = match spec.loss {
        Loss::Mse => "mse",
        Loss::CrossEntropy => "cross_entropy",
    };
    let torch = ask(&Request::Train {
        args: &args,
        targets: &target_tensors,
        loss: loss_name,
        optimizer: &optimizer,
        steps: spec.steps,
    })?;
    let mut case = CaseFailure {
        inputs: layer
            .args
            .iter()
            .map(|a| a.name.clone())
            .zip(args.iter().cloned())
            .collect(),
        ..CaseFailure::default()
    };
    let batch = Batch {
        args: &args,
        state_dict: &forward.state_dict,
        aliases: &forward.aliases,
        rename: &layer.rename,
        buffers: &forward.buffers,
        targets: &targets,
        dtype,
    };
    port.take_fault();
    port.enter_case(params);
    let mut training = match train_port(port, spec, &batch) {
        Ok(t) => t,
        Err(e) => {
            match port.take_fault() {
                // The port's own failure (a panic, a call that did not return) as such.
                Some(fault) if fault.panicked || fault.stuck.is_some() => {
                    fault.report(&mut case, params)
                }
                _ => case.port = Some(PortFault::Errored(e)),
            }
            return Err(failure(FailureKind::Case(Box::new(case))));
        }
    };
    // Which gradients are rounding noise: PyTorch's at the initial weights, in both precisions.
    if dtype != DType::F64 {
        let gradients = reference_gradients(
            source, layer, dtype, params, spec, &args, &forward, &targets,
        );
        for p in &mut training.grads {
            let leaf = format!("grad.{}", p.name);
            let find = |set: &Named| {
                set.iter()
                    .find(|(n, _)| *n == leaf)
                    .map(|(_, t)| t.to_f64())
            };
            if let Some(g) = &gradients {
                let pair = find(&g.expected).zip(g.precise.as_ref().and_then(find));
                p.reference =
                    pair.filter(|(l, h)| l.len() == p.max_abs.len() && h.len() == l.len());
            }
        }
    }
    let torch_losses = torch
        .expected
        .iter()
        .find(|(n, _)| n == "losses")
        .map(|(_, t)| t.to_f64())
        .unwrap_or_default();
    let mut issues = Vec::new();
    let mut health = Vec::new();

    // Does it overfit?
    let initial = training.losses.first().copied().unwrap_or(f64::NAN);
    let last = training.losses.last().copied().unwrap_or(f64::NAN);
    let bound = spec.threshold.max(spec.ratio * initial);
    let torch_last = torch_losses.last().copied().unwrap_or(f64::NAN);
    // A NaN loss does not reach the bound either.
    let too_weak = torch_last.is_nan() || torch_last >= bound;
    if last.is_nan() || last >= bound {
        issues.push(TrainingIssue::DoesNotOverfit(format!(
            "the port does not overfit one batch: its loss went {} (it must end below {}); \
             PyTorch's went {}",
            curve(&training.losses),
            num(bound),
            curve(&torch_losses)
        )));
    }
    // Parameters never updated (a tensor whose every gradient is rounding noise need not move:
    // SGD's steps of lr × noise round away).
    for (((name, before), (_, after)), grads) in training
        .initial
        .iter()
        .zip(&training.final_weights)
        .zip(&training.grads)
    {
        let all_inert = !grads.max_abs.is_empty() && grads.inert().iter().all(|i| *i);
        if before == after && training.never_read.contains(name) {
            // Said by the forward check as what it is; no gradient can reach what is not read.
            issues.push(TrainingIssue::Other(format!(
                "`{name}` was never updated in {} steps: the port never reads it (the reference \
                 uses it; see the forward check)",
                spec.steps
            )));
        } else if before == after && !all_inert {
            issues.push(TrainingIssue::Other(format!(
                "`{name}` was never updated in {} steps: the optimizer does not get it, or no \
                 gradient reaches it (a detach, a fused op without backward)",
                spec.steps
            )));
        }
    }
    // Parity with PyTorch, step by step.
    let diverged = training
        .losses
        .iter()
        .zip(&torch_losses)
        .position(|(p, t)| (p - t).abs() > PARITY_LOSS_RTOL * t.abs() + 1e-7 || p.is_nan());
    let loss_parity = training
        .losses
        .iter()
        .zip(&torch_losses)
        .map(|(p, t)| (p - t).abs() / t.abs().max(f64::MIN_POSITIVE))
        .fold(0.0f64, f64::max);
    if let Some(step) = diverged {
        issues.push(TrainingIssue::Other(format!(
            "the training parts from PyTorch's at step {step}: loss {} in the port, {} in PyTorch \
             (allowed relative difference {}); before: {}",
            num(training.losses[step]),
            num(torch_losses[step]),
            num(PARITY_LOSS_RTOL),
            if step == 0 {
                "nothing (the first loss already differs: check the forward pass)".to_string()
            } else {
                format!("step {} agreed", step - 1)
            }
        )));
    }
    // An update that goes uphill where PyTorch's goes down is the wrong sign, whatever else differs.
    if let ([p0, p1, ..], [t0, t1, ..]) = (&training.losses[..], &torch_losses[..]) {
        if p1 > p0 && t1 < t0 {
            issues.push(TrainingIssue::LikelyCause(format!(
                "the port's first update raised the loss ({} → {}) where PyTorch's lowered it ({} \
                 → {}): the update has the wrong sign (`w + lr·g` instead of `w − lr·g`)",
                num(*p0),
                num(*p1),
                num(*t0),
                num(*t1)
            )));
        }
    }
    let updates = update_parity(&training, &torch.expected);
    let worst = updates
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|(_, r)| r.is_nan() || *r > PARITY_UPDATE_RTOL);
    if let (None, Some((name, rel))) = (diverged, worst) {
        issues.push(TrainingIssue::Other(format!(
            "the losses agree with PyTorch's at every step but the weights moved differently: \
             `{name}`'s total update differs from PyTorch's by {} of its size (allowed {})",
            num(*rel),
            num(PARITY_UPDATE_RTOL)
        )));
    }
    // Gradient health.
    for p in &training.grads {
        let name = &p.name;
        let max = p.norms.iter().copied().fold(0.0f64, f64::max);
        if max == 0.0 {
            health.push(format!("`{name}`: no gradient at any step"));
        }
        let all_inert = !p.max_abs.is_empty() && p.inert().iter().all(|i| *i);
        if max > 0.0 && max < 1e-7 && !all_inert {
            health.push(format!(
                "`{name}`: vanishing gradient (norm below 1e-7 at every step; max {})",
                num(max)
            ));
        }
        if max > 1e3 {
            health.push(format!(
                "`{name}`: exploding gradient (norm up to {})",
                num(max)
            ));
        }
        let dead = p.dead_rows();
        if !dead.is_empty() {
            health.push(format!(
                "`{name}`: {} dead units (rows {:?} get a zero gradient at every step: a ReLU that \
                 never fires?)",
                dead.len(),
                &dead[..dead.len().min(8)]
            ));
        }
        let inert = p.inert().iter().filter(|i| **i).count();
        if inert > 0 {
            health.push(format!(
                "`{name}`: {inert} of {} elements get only rounding noise as gradient (no effect on \
                 the loss in exact arithmetic, e.g. a key bias under softmax); left out of the \
                 update parity",
                p.max_abs.len()
            ));
        }
    }
    let mut figures = vec![
        ("loss.initial".to_string(), initial),
        ("loss.final".to_string(), last),
        // What the final loss must stay below: the snapshot gives the final loss as a factor of it.
        ("loss.bound".to_string(), bound),
    ];
    let n = training.losses.len();
    if n > 4 {
        figures.insert(1, (format!("loss.step{}", n / 4), training.losses[n / 4]));
        figures.insert(2, (format!("loss.step{}", n / 2), training.losses[n / 2]));
    }
    figures.push(("parity.loss".to_string(), loss_parity));
    let worst_update = updates.iter().map(|(_, r)| *r).fold(0.0f64, f64::max);
    figures.push(("parity.update".to_string(), worst_update));
    // When PyTorch itself does not get there and the port trains like it, the settings are too
    // weak for this model, not the port: the port is judged over the steps PyTorch needs (within
    // the probe's bound), or, where PyTorch does not get there within it either, on its parity
    // with PyTorch at every step; the snapshot says which.
    let like_pytorch = diverged.is_none();
    if probe && too_weak && like_pytorch && issues.iter().all(TrainingIssue::is_does_not_overfit) {
        let probe_steps = (spec.steps.saturating_mul(PROBE_FACTOR)).min(PROBE_MAX_STEPS);
        let longer = ask(&Request::Train {
            args: &args,
            targets: &target_tensors,
            loss: loss_name,
            optimizer: &optimizer,
            steps: probe_steps,
        });
        let losses = match longer {
            Ok(longer) => longer
                .expected
                .iter()
                .find(|(n, _)| n == "losses")
                .map(|(_, t)| t.to_f64())
                .unwrap_or_default(),
            Err(_) => {
                let mut f = failure(FailureKind::Config(format!(
                    "the overfit settings are too weak for this model, not the port: PyTorch \
                     itself ends at {} after {} steps (it must end below {}), and the port trains \
                     like it (the losses agree at every step); run it live to learn how many \
                     steps PyTorch needs",
                    num(torch_last),
                    spec.steps,
                    num(bound)
                )));
                f.check = Kind::Overfit;
                return Err(f);
            }
        };
        // The loss before step k + 1 is below the bound: k + 1 steps suffice.
        if let Some(k) = losses.iter().position(|l| *l < bound) {
            // Those steps with a fifth's margin, as the note suggests them, within the probe's.
            let steps = suggested_steps(k as u32).min(probe_steps);
            let note = Note {
                summary: format!(
                    "overfit(steps = {}) is too short for this model: PyTorch itself does not \
                     reach the bound in {} steps, so the port was trained {steps} steps beside it \
                     (use `overfit(steps = {steps})`)",
                    spec.steps, spec.steps
                ),
                detail: format!(
                    "overfit(steps = {}) is too short for this model: PyTorch itself ends at {} \
                     after {} steps (it must end below {}) and reaches the bound after {k}; the \
                     port, which trained like it at every step, was trained {steps} steps beside \
                     it and judged there (use `overfit(steps = {steps})`)",
                    spec.steps,
                    num(torch_last),
                    spec.steps,
                    num(bound)
                ),
            };
            let longer = OverfitSpec {
                steps,
                ..spec.clone()
            };
            return match run(layer, port, &longer, source, params, dtype, false) {
                Ok((mut record, health)) => {
                    record.notes.push(note);
                    Ok((record, health))
                }
                Err(mut f) => {
                    f.notes.push(format!("note: {}", note.detail));
                    Err(f)
                }
            };
        }
        // PyTorch does not overfit within the probe either: the port is judged by its parity
        // with PyTorch at every step (the losses, and each parameter's total update).
        let note = Note {
            summary: format!(
                "the overfit settings are too weak for this model: PyTorch itself does not reach \
                 the bound in {probe_steps} steps, so the port is judged by training like it at \
                 every one of its {} steps (losses and updates agree); to see it overfit, raise \
                 the learning rate (`overfit(lr = {})`) or loosen `ratio`/`threshold`",
                spec.steps,
                num(10.0 * spec.optimizer.lr())
            ),
            detail: format!(
                "the overfit settings are too weak for this model: PyTorch itself ends at {} \
                 after {} steps and at {} after {probe_steps} (it must end below {}); the port \
                 trains like it at every step (losses and updates agree) and is judged by that",
                num(torch_last),
                spec.steps,
                num(losses.last().copied().unwrap_or(f64::NAN)),
                num(bound)
            ),
        };
        eprintln!("golden: `{}`: {}", layer.name, note.detail);
        // The final loss is not held to the bound PyTorch does not reach.
        figures.retain(|(name, _)| name != "loss.bound");
        return Ok((
            CaseRecord {
                params: params.clone(),
                leaves: Vec::new(),
                figures,
                notes: vec![note],
                evaluations: None,
            },
            health,
        ));
    }
    if issues.is_empty() {
        Ok((
            CaseRecord {
                params: params.clone(),
                leaves: Vec::new(),
                figures,
                notes: Vec::new(),
                evaluations: None,
            },
            health,
        ))
    } else {
        case.training_issues = issues;
        case.training_issues
            .extend(health.iter().cloned().map(TrainingIssue::Health));
        case.figures = figures;
        Err(failure(FailureKind::Case(Box::new(case))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grads(max_abs: Vec<f64>, row: usize) -> ParamGrads {
        ParamGrads {
            name: "w".into(),
            norms: vec![1.0],
            max_abs,
            row,
            reference: None,
        }
    }

    #[test]
    fn a_tensor_of_noise_alone_is_inert_by_its_float64_gradient() {
        // Every element noise-sized: none is small next to the rest of its tensor.
        let mut p = grads(vec![2e-9, 1e-9, 3e-9], 3);
        assert_eq!(p.inert(), vec![false, false, false]);
        // PyTorch's float64 gradient is 2^-29 of its float32 one: noise. The second element's
        // float32 gradient rounded to zero at the first step: the port's largest says its noise.
        p.reference = Some((vec![2e-9, 0.0, 1e-3], vec![4e-18, 1e-18, 1e-3]));
        assert_eq!(p.inert(), vec![true, true, false]);
    }

    #[test]
    fn dead_rows_are_rows_without_any_gradient() {
        let p = grads(vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 3.0], 2);
        assert_eq!(p.dead_rows(), vec![0, 2]);
        // A parameter with no gradient at all is not "dead units": it is reported as such.
        assert!(grads(vec![0.0; 4], 2).dead_rows().is_empty());
        // One row: nothing to compare with.
        assert!(grads(vec![0.0, 1.0], 2).dead_rows().is_empty());
    }

    #[test]
    fn inert_elements_are_noise_next_to_the_rest() {
        let p = grads(vec![1.0, 1e-9, 0.0, 0.5], 1);
        assert_eq!(p.inert(), vec![false, true, false, false]);
        // A diverged training has no scale to call anything noise.
        assert!(!grads(vec![f64::INFINITY, 1e-9], 1)
            .inert()
            .iter()
            .any(|i| *i));
    }

    #[test]
    fn the_curve_shows_where_the_loss_stopped_being_finite() {
        let mut losses: Vec<f64> = (0..20).map(|i| 1.0 / (1.0 + i as f64)).collect();
        losses[7] = f64::INFINITY;
        let c = curve(&losses);
        assert!(c.starts_with("step 0: 1, step 2: "), "{c}");
        assert!(
            c.contains("step 7: inf") && c.ends_with("(first not finite at step 7)"),
            "{c}"
        );
    }
}
