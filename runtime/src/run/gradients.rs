//! The gradient check: `#[golden_layer(grad)]` generates `#[test] fn gradients()`.
//!
//! On every generated case the port's gradients of `L = Σ sum(out · cotangent)` (a random cotangent
//! per output leaf, from the case seed) are checked:
//!
//! * **Against PyTorch's autograd** — the verdict wherever the reference has one. The port's
//!   gradients in the case dtype are judged against PyTorch's float64 gradients (computed with the
//!   reference's own upcasts promoted to float64), allowing a multiple of the error PyTorch's own
//!   case-dtype autograd makes on this case (the rounding estimate: OpInfo's and the accuracy
//!   minifier's rule), leaf by leaf (`grad.x`, `grad.fc1.weight`). A gradient PyTorch has and the
//!   port has not is named with the usual cause: a fused op without backward, or a detach.
//! * **Against finite differences**, on the port alone, in float64 — no Python. For each input (and,
//!   in module form, each parameter) `w`, a random unit direction `u`: the analytic `⟨∇_w L, u⟩`
//!   must match `(L(w + εu) − L(w − εu)) / 2ε` within `atol + rtol·|numeric|` (gradcheck's fast
//!   mode; a few forward passes whatever the size). Cases are generated and shrunk on these
//!   directional derivatives alone; on the smallest failing case, golden then computes the Jacobian
//!   of each disagreeing (input, output) pair element by element, once, and reports its worst entry
//!   (`GradRunner::locate`). `mode = full` always compares whole Jacobians. Also: a zero cotangent must give zero gradients, and two
//!   backward passes the same ones. Where PyTorch's autograd is the verdict and the port agrees
//!   with it, a disagreement only finite differences see is a note, not a failure — with the reason
//!   when golden can tell: the port computes below float64 (a faithful port of Hugging Face's
//!   `.to(torch.float32)`), the loss is not smooth at the scale of ε, or PyTorch defines the
//!   gradient by convention (an embedding's `padding_idx` row). With the numpy backend there is no
//!   autograd and finite differences are the verdict; they keep finding a wrong custom backward.

use crate::answers::live::{Named, ReferenceOutputs, Request};
use crate::answers::params::StateDict;
use crate::answers::source::{Answer, Source};
use crate::describe::checks::{GradMode, GradSpec, Kind};
use crate::describe::inputs::{self, CaseParams, Rng};
use crate::describe::layer::{Backend, Form, Layer};
use crate::describe::numbers::num;
use crate::describe::outputs::Outputs;
use crate::judge::compare::unravel;
use crate::python::worker::WorkerError;
use crate::report::failure::{CaseFailure, Failure, PortFault};
use crate::report::issues::{FdDisagreement, GradientIssue};
use crate::report::passed::{reference_notes, CaseRecord, Note, Report};
use crate::run::check::{self, AfterFailure, CaseRunner, Outcome, Port};
use crate::run::forward::call_port;
use crate::run::port::{Heartbeat, SharedPort};
use crate::run::port::{PortFailure, PortThread};
use candle_core::{DType, Device, Tensor, Var};
use golden_files::{HostTensor, WireDType};
use std::ops::Range;
use std::sync::Arc;

/// Check a port's gradients (the layer's `grad` options, or the defaults).
pub fn check(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    // Through time, gradients mean something on the prefill: one forward of the whole input.
    let budgeted = check::with_budget(layer);
    let layer = &budgeted.without_schedule();
    let spec = layer.grad.clone().unwrap_or_default();
    let description = format!(
        "{}{}\n",
        layer.description(check::cases(layer, spec.cases), check::seed()),
        spec.describe()
    );
    let runner = GradRunner {
        layer,
        port: PortThread::of(port, layer),
        spec,
        locate: std::cell::Cell::new(false),
    };
    check::run(
        layer,
        Kind::Gradients,
        runner.spec.cases,
        &description,
        &runner,
    )
}

struct GradRunner<'a> {
    layer: &'a Layer,
    port: PortThread,
    spec: GradSpec,
    /// Fast mode: compute the Jacobian of a pair whose directional derivative disagrees with
    /// finite differences. Off while cases are generated and shrunk (each Jacobian costs two
    /// forward passes per input element and a backward per output element), on for the final,
    /// smallest case (`finish`).
    locate: std::cell::Cell<bool>,
}

/// A cotangent (or a direction) of `t`'s shape: standard normal from the case seed.
fn random_like(t: &HostTensor, seed: u64, stream: &str, dtype: DType) -> HostTensor {
    let values = Rng::new(seed, stream).normals(t.numel());
    inputs::float_tensor(t.shape.clone(), &values, dtype)
}

/// The cotangent of each float output, drawn from the case seed: the port's and the reference's
/// backward passes (and a replay of a recorded one) see the same.
fn cotangents(outputs: &Named, seed: u64, dtype: DType) -> Named {
    outputs
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(name, t)| {
            (
                name.clone(),
                random_like(t, seed, &format!("cotangent.{name}"), dtype),
            )
        })
        .collect()
}

/// The reference's forward pass on one case (no trace).
fn forward(
    source: &Source,
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    args: &[HostTensor],
) -> Answer {
    source.request(
        layer,
        dtype,
        params,
        &Request::Forward {
            args,
            trace: false,
            twice: false,
            precise: true,
            plan: None,
            stage: None,
        },
    )
}

fn to_f64(t: &HostTensor) -> HostTensor {
    if t.dtype.is_float() {
        HostTensor::from_f64(t.shape.clone(), &t.to_f64())
    } else {
        t.clone()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One run of the port on given tensors: its outputs, and the Vars of the wrt inputs/parameters.
struct PortRun {
    outputs: Outputs,
    /// (name, var) for each differentiated input and parameter.
    vars: Vec<(String, Var)>,
    /// The port's taps (`golden::tap`), when the run recorded them: where a gradient stops.
    taps: crate::run::forward::Taps,
}

/// What gradients are asked for, by name.
struct Targets {
    /// Indices of the inputs to differentiate.
    args: Vec<usize>,
    /// Parameters to differentiate (module form).
    params: Vec<String>,
}

/// The port's side of one case, in float64, for the finite differences.
struct Case64 {
    args: Vec<HostTensor>,
    state: Named,
    aliases: Vec<Vec<String>>,
    /// Unit-norm cotangents over all leaves.
    v: Named,
}

/// What finite differences found: per target the figure `|analytic − numeric| / allowed`, and the
/// disagreements.
type FdFindings = (Vec<(String, f64)>, Vec<FdDisagreement>);

impl GradRunner<'_> {
    fn targets(&self, state_dict: &Named, buffers: &[String], aliases: &[Vec<String>]) -> Targets {
        let wanted = |name: &str| {
            self.spec
                .wrt
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == name))
        };
        let args = (0..self.layer.args.len())
            .filter(|&i| self.layer.args[i].dist.is_float() && wanted(&self.layer.args[i].name))
            .collect();
        // A tied tensor is one parameter, named (as PyTorch names it) by its first name.
        let tied_later = |n: &str| aliases.iter().any(|g| g.iter().skip(1).any(|m| m == n));
        let params = state_dict
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !buffers.contains(n) && !tied_later(n) && wanted(n))
            .collect();
        Targets { args, params }
    }

    /// Run the port with the wrt inputs and parameters as Vars.
    fn run_port(
        &self,
        args: &[HostTensor],
        state_dict: &Named,
        aliases: &[Vec<String>],
        dtype: DType,
        targets: &Targets,
    ) -> Result<(PortRun, Option<StateDict>), String> {
        self.run_port_tapped(args, state_dict, aliases, dtype, targets, false)
    }

    /// [`GradRunner::run_port`], recording the port's taps when `taps` is set.
    fn run_port_tapped(
        &self,
        args: &[HostTensor],
        state_dict: &Named,
        aliases: &[Vec<String>],
        dtype: DType,
        targets: &Targets,
        taps: bool,
    ) -> Result<(PortRun, Option<StateDict>), String> {
        let device = Device::Cpu;
        let mut vars = Vec::new();
        let mut tensors = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let t = a.to_candle(&device).map_err(|e| e.to_string())?;
            if targets.args.contains(&i) {
                let var = Var::from_tensor(&t).map_err(|e| e.to_string())?;
                tensors.push(var.as_tensor().clone());
                vars.push((self.layer.args[i].name.clone(), var));
            } else {
                tensors.push(t);
            }
        }
        let state = match self.layer.form {
            Form::Module => Some(
                StateDict::serve(state_dict, aliases, &self.layer.rename, dtype, &device)
                    .map_err(|e| e.to_string())?,
            ),
            Form::Function => None,
        };
        if let Some(state) = &state {
            for name in &targets.params {
                if let Some(var) = state.var(name) {
                    vars.push((name.clone(), var));
                }
            }
        }
        let (outputs, taps) = call_port(&self.port, tensors, state.as_ref(), taps, None).map_err(
            |PortFailure {
                 message, panicked, ..
             }| {
                if panicked {
                    format!("the port panicked: {message}")
                } else {
                    format!("the port returned an error: {message}")
                }
            },
        )?;
        Ok((
            PortRun {
                outputs,
                vars,
                taps,
            },
            state,
        ))
    }

    /// The directions of a layer at size (its targets hold [`DIRECTIONAL_AT`] values or more):
    /// per target, the random unit direction finite differences move it along, which PyTorch's
    /// gradient is also compared along (one scalar per target: gradcheck's fast mode, vᵀJu)
    /// instead of value by value; `None` below that size.
    fn directions(
        &self,
        seed: u64,
        args: &[HostTensor],
        state_dict: &Named,
        targets: &Targets,
    ) -> Option<Named> {
        let mut shapes: Vec<(String, Vec<usize>)> = targets
            .args
            .iter()
            .map(|&i| (self.layer.args[i].name.clone(), args[i].shape.clone()))
            .collect();
        shapes.extend(targets.params.iter().filter_map(|name| {
            let (_, t) = state_dict.iter().find(|(n, _)| n == name)?;
            Some((name.clone(), t.shape.clone()))
        }));
        let values: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        (values >= DIRECTIONAL_AT).then(|| {
            shapes
                .into_iter()
                .map(|(name, shape)| {
                    let u = Self::direction(seed, &name, shape.iter().product());
                    let u = HostTensor::from_f64(shape, &u);
                    (name, u)
                })
                .collect()
        })
    }

    /// PyTorch's gradients of `Σ sum(out · cotangent)` on one case, for the same targets (along
    /// `along`'s directions, when given: see [`GradRunner::directions`]).
    #[allow(clippy::too_many_arguments)]
    fn reference_gradients(
        &self,
        source: &Source,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
        cotangents: &Named,
        targets: &Targets,
        along: Option<&Named>,
    ) -> Answer {
        let layer = self.layer;
        let names: Vec<String> = layer.args.iter().map(|a| a.name.clone()).collect();
        let cotangents: Vec<HostTensor> = cotangents.iter().map(|(_, t)| t.clone()).collect();
        let request = Request::Gradients {
            args,
            cotangents: &cotangents,
            names: &names,
            wrt: &targets.args,
            params: layer.form == Form::Module,
            along: along.map(Vec::as_slice),
        };
        source.request(layer, dtype, params, &request)
    }

    /// Whether the reference has an autograd to judge by (the torch backend).
    fn has_autograd(&self) -> bool {
        self.layer.backend == Backend::Torch
    }

    /// The port in f64 with the input or parameter `name` replaced by `moved`, differentiating
    /// nothing: one evaluation of a finite difference.
    fn run_moved(&self, case: &Case64, name: &str, moved: HostTensor) -> Result<PortRun, String> {
        let mut args = case.args.clone();
        let mut state = case.state.clone();
        if let Some(i) = self.layer.args.iter().position(|x| x.name == name) {
            args[i] = moved;
        } else {
            // A tied tensor moves under every one of its names.
            let group = case
                .aliases
                .iter()
                .find(|g| g.iter().any(|n| n == name))
                .cloned()
                .unwrap_or_else(|| vec![name.to_string()]);
            for entry in state.iter_mut().filter(|(n, _)| group.contains(n)) {
                entry.1 = moved.clone();
            }
        }
        let none = Targets {
            args: Vec::new(),
            params: Vec::new(),
        };
        Ok(self
            .run_port(&args, &state, &case.aliases, DType::F64, &none)?
            .0)
    }

    /// `Σ sum(out · cotangent)` per leaf (in the order of `cotangents`), as candle scalars.
    fn leaf_losses(
        outputs: &Outputs,
        cotangents: &[(String, HostTensor)],
    ) -> Result<Vec<Tensor>, String> {
        cotangents
            .iter()
            .map(|(name, c)| {
                let out = outputs.leaf(name)?;
                let c = c
                    .to_candle(out.device())
                    .and_then(|c| c.to_dtype(out.dtype()))
                    .map_err(|e| e.to_string())?;
                out.mul(&c)
                    .and_then(|p| p.sum_all())
                    .map_err(|e| format!("`{name}`: {e}"))
            })
            .collect()
    }

    /// The port's gradients of Σ leaves, by target name (None: no gradient reaches it). The
    /// backward pass runs the port's graph: on the port's thread, like the port.
    fn gradients(
        &self,
        run: &PortRun,
        loss: &Tensor,
    ) -> Result<Vec<(String, Option<HostTensor>)>, String> {
        let loss = loss.clone();
        let grads = self
            .port
            .run("the backward pass", move || loss.backward())
            .map_err(|f| format!("the backward pass panicked: {}", f.message))?
            .map_err(|e| format!("backward: {e}"))?;
        run.vars
            .iter()
            .map(|(name, var)| {
                let g = grads
                    .get(var.as_tensor())
                    .map(HostTensor::from_candle)
                    .transpose()
                    .map_err(|e| e.to_string())?;
                Ok((name.clone(), g))
            })
            .collect()
    }

    fn total(losses: &[Tensor]) -> Result<Tensor, String> {
        let mut total = losses
            .first()
            .ok_or("the port has no float outputs")?
            .clone();
        for l in &losses[1..] {
            total = (total + l).map_err(|e| e.to_string())?;
        }
        Ok(total)
    }
}

impl CaseRunner for GradRunner<'_> {
    fn run(&self, source: &Source, dtype: DType, params: &CaseParams) -> Outcome {
        let layer = self.layer;
        self.port.take_fault();
        self.port.enter_case(params);
        let mut failure = CaseFailure::default();
        let args = match inputs::make_args(layer, params, dtype) {
            Ok(a) => a,
            Err(e) => {
                failure.inputs_error = Some(e);
                return Outcome::Fail(Box::new(failure));
            }
        };
        failure.inputs = layer
            .args
            .iter()
            .map(|a| a.name.clone())
            .zip(args.iter().cloned())
            .collect();
        let answer = forward(source, layer, dtype, params, &args);
        let forward = match Outcome::reference_outputs(answer, &mut failure) {
            Ok(r) => r,
            Err(outcome) => return outcome,
        };
        let elements = forward
            .expected
            .iter()
            .filter(|(_, t)| t.dtype.is_float())
            .map(|(_, t)| inputs::elements(&t.shape))
            .sum();
        if let Err(e) = inputs::within_budget(elements, || {
            (
                format!(
                    "the cotangents of the reference's outputs ({elements} elements) are too large"
                ),
                "make the outputs smaller (narrow the dims)".to_string(),
            )
        }) {
            failure.inputs_error = Some(e);
            return Outcome::Fail(Box::new(failure));
        }
        let cotangents = cotangents(&forward.expected, params.seed, dtype);
        failure.cotangents = cotangents.clone();
        let targets = self.targets(&forward.state_dict, &forward.buffers, &forward.aliases);
        for name in self.spec.wrt.iter().flatten() {
            let known = layer.args.iter().any(|a| &a.name == name)
                || forward.state_dict.iter().any(|(n, _)| n == name);
            if !known {
                let have: Vec<&str> = forward.state_dict.iter().map(|(n, _)| n.as_str()).collect();
                failure.inputs_error = Some(format!(
                    "grad(wrt = [...]) names `{name}`, which is neither an input nor a parameter of \
                     the reference (its parameters: {})",
                    if have.is_empty() { "none".to_string() } else { have.join(", ") }
                ));
                return Outcome::Fail(Box::new(failure));
            }
        }
        let names: Vec<String> = layer.args.iter().map(|a| a.name.clone()).collect();
        let mut notes = reference_notes(&forward, &names);
        if self.has_autograd() {
            let along = self.directions(params.seed, &args, &forward.state_dict, &targets);
            if let Some(along) = &along {
                let values: usize = along.iter().map(|(_, u)| u.numel()).sum();
                let summary = "the gradients are compared with PyTorch's along one random unit \
                               direction each (gradcheck's fast mode): a layer at size has too many \
                               values to compare one by one"
                    .to_string();
                notes.push(crate::report::passed::Note {
                    detail: format!("{summary} ({values} values in {} targets)", along.len()),
                    summary,
                });
            }
            let answer = self.reference_gradients(
                source,
                dtype,
                params,
                &args,
                &cotangents,
                &targets,
                along.as_ref(),
            );
            let reference = match Outcome::reference_outputs(answer, &mut failure) {
                Ok(r) => r,
                Err(outcome) => return outcome,
            };
            // What the gradient answer says about the reference (elements it cannot judge).
            for note in reference_notes(&reference, &names) {
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
            if let Err(e) = self.compare_with_pytorch(
                &args,
                &forward,
                &reference,
                &cotangents,
                dtype,
                &targets,
                along.as_ref(),
                &mut failure,
            ) {
                // The port's own failure (a panic, a call that did not return) as such.
                match self.port.take_fault() {
                    Some(fault) => fault.report(&mut failure, params),
                    None => failure.port = Some(PortFault::Errored(e)),
                }
                return Outcome::Fail(Box::new(failure));
            }
        }
        let mut figures = Vec::new();
        match self.finite_differences(&args, &forward, &cotangents, params, &targets, &mut failure)
        {
            Ok((f, issues)) => {
                figures = f;
                for issue in issues {
                    // Where PyTorch's autograd judged this gradient and the port agrees with it,
                    // what only finite differences see is a note.
                    let agreed = self.has_autograd()
                        && failure
                            .leaves
                            .iter()
                            .find(|l| l.name == format!("grad.{}", issue.target))
                            .is_some_and(crate::judge::compare::Leaf::passes);
                    if agreed {
                        notes.push(self.fd_note(&issue, &args, &forward, &cotangents, params));
                    } else {
                        failure
                            .gradient_issues
                            .push(GradientIssue::FiniteDifferences(issue));
                    }
                }
            }
            Err(e) => match self.port.take_fault() {
                Some(fault) if fault.stuck.is_some() => {
                    fault.report(&mut failure, params);
                    return Outcome::Fail(Box::new(failure));
                }
                _ => failure.gradient_issues.push(GradientIssue::Other(format!(
                    "finite differences run the port in float64, and there it fails: {e} (a fused \
                     kernel without an f64 version? cast to the input's dtype rather than to f32)"
                ))),
            },
        }
        if failure.params.is_empty()
            && failure.gradient_issues.is_empty()
            && failure
                .leaves
                .iter()
                .all(crate::judge::compare::Leaf::passes)
        {
            Outcome::Pass(CaseRecord {
                params: params.clone(),
                leaves: failure.leaves,
                figures,
                notes,
                evaluations: None,
            })
        } else {
            failure.notes = notes;
            Outcome::Fail(Box::new(failure))
        }
    }

    fn reference_only(
        &self,
        source: &Source,
        dtype: DType,
        params: &CaseParams,
    ) -> Option<WorkerError> {
        let layer = self.layer;
        let args = inputs::make_args(layer, params, dtype).ok()?;
        let forward = match forward(source, layer, dtype, params, &args) {
            Answer::Outputs(r) => r,
            other => return other.dead_worker(),
        };
        if !self.has_autograd() {
            return None;
        }
        let cotangents = cotangents(&forward.expected, params.seed, dtype);
        let targets = self.targets(&forward.state_dict, &forward.buffers, &forward.aliases);
        let along = self.directions(params.seed, &args, &forward.state_dict, &targets);
        self.reference_gradients(
            source,
            dtype,
            params,
            &args,
            &cotangents,
            &targets,
            along.as_ref(),
        )
        .dead_worker()
    }

    fn finish(
        &self,
        source: &Source,
        dtype: DType,
        failure: &mut Failure,
        others: Vec<(CaseParams, Box<CaseFailure>)>,
        after: &AfterFailure,
    ) {
        let first = others.into_iter().next();
        let crate::report::failure::FailureKind::Case(c) = &mut failure.kind else {
            return;
        };
        // Shrinking judged each case by directional derivatives; the smallest case runs once
        // more, now computing the Jacobian of each pair that disagrees, to say which entry.
        if let Some(case) = failure.case.as_ref().filter(|_| {
            self.spec.mode == GradMode::Fast
                && c.gradient_issues
                    .iter()
                    .any(GradientIssue::is_finite_differences)
                && after.take(
                    1,
                    0,
                    "the Jacobian that says which entry of a gradient disagrees",
                )
        }) {
            self.locate.set(true);
            let again = self.run(source, dtype, case);
            self.locate.set(false);
            if let Outcome::Fail(located) = again {
                c.gradient_issues = located.gradient_issues;
            }
        }
        // The smallest case can hide what another one showed (zero inputs give zero gradients
        // on both sides): add that case's own findings, those of inputs and parameters the
        // smallest case does not already report.
        if let Some((case, first)) = first {
            let reported: Vec<String> = c
                .gradient_issues
                .iter()
                .filter_map(|i| i.target().map(str::to_string))
                .collect();
            for issue in first.gradient_issues {
                let known = issue
                    .target()
                    .is_some_and(|t| reported.iter().any(|r| r == t))
                    || issue.is_forward_differs();
                if !known && !c.gradient_issues.contains(&issue) {
                    c.gradient_issues.push(GradientIssue::OnAnotherCase {
                        case: case.clone(),
                        issue: Box::new(issue),
                    });
                }
            }
        }
        // A backward that disagrees with the port's own finite differences is a bug in a
        // backward when the forward is right: say so, and where such bugs usually are. When the
        // forward differs, that comes first, and the finite differences may just see the port's
        // own precision (an f32 softmax against float64 steps): no blame on the backward. Only
        // the smallest case's own disagreements blame it: another case's come without its
        // forward's verdict (a forward that differs there is not carried over).
        let forward_first = c
            .gradient_issues
            .iter()
            .position(GradientIssue::is_forward_differs);
        match forward_first {
            Some(at) => {
                let issue = c.gradient_issues.remove(at);
                c.gradient_issues.insert(0, issue);
            }
            None if c
                .gradient_issues
                .iter()
                .any(GradientIssue::is_finite_differences) =>
            {
                c.gradient_issues
                    .push(GradientIssue::LikelyCause(BACKWARD_CAUSE.to_string()));
            }
            None => {}
        }
        check::leave_artifacts(self.layer, Kind::Gradients, dtype, failure, after);
    }
}

/// The port's forward against the reference's, on the case the gradients are checked on: `Some`
/// with what differs when a float leaf is outside its tolerance.
fn forward_differs(
    outputs: &Outputs,
    forward: &ReferenceOutputs,
    tol: Option<crate::describe::layer::Tol>,
) -> Option<GradientIssue> {
    let port: Vec<(String, HostTensor)> = outputs
        .0
        .iter()
        .filter_map(|(n, t)| Some((n.clone(), HostTensor::from_candle(t).ok()?)))
        .collect();
    let leaves = forward.compare(&port, tol, crate::judge::compare::ROUNDING_FACTOR);
    let differ: Vec<String> = leaves
        .iter()
        .filter(|l| !l.passes())
        .map(|l| match &l.verdict {
            crate::judge::compare::Verdict::Values(v) => format!(
                "`{}` ({} of {} elements, up to {}× the tolerance)",
                l.name,
                v.mismatched,
                v.numel,
                num(v.worst_ratio)
            ),
            _ => format!("`{}`", l.name),
        })
        .collect();
    (!differ.is_empty()).then_some(GradientIssue::ForwardDiffers(differ))
}

/// The most port evaluations fast mode spends on one Jacobian to locate a wrong entry (a backward
/// per output element, two forward passes per input element): beyond, it halves directional
/// derivatives instead (`GradRunner::bisect`). `mode = full` asks for every entry, and computes
/// the Jacobian whatever its size.
pub const JACOBIAN_EVALUATIONS: usize = 4096;

/// From this many values in its targets (inputs and parameters) on, a layer's gradients are
/// compared with PyTorch's along one random direction per target (`GradRunner::directions`): a
/// decoder layer's millions of values, their float64 and rounding estimate, cost a second a case to
/// send and compare value by value.
pub const DIRECTIONAL_AT: usize = 1 << 20;

/// The likely cause of a port whose backward is not the derivative of its own forward.
const BACKWARD_CAUSE: &str = "the port's backward is not the derivative of its own \
    forward (its backward against its own finite differences, above), so the bug is in how it \
    differentiates: a `detach()` or a value taken out of the graph (`to_vec`, a tensor built \
    anew), a custom op's `bwd`, or a candle op whose backward is wrong at these shapes (candle \
    0.11.1's `conv1d` backward is one); check the port's steps one at a time with `grad` to find \
    which";

impl GradRunner<'_> {
    /// The port's gradients in the case dtype against PyTorch's float64 gradients, allowing the
    /// multiple [`GRADIENT_ROUNDING_FACTOR`](crate::judge::compare::GRADIENT_ROUNDING_FACTOR) of
    /// the error PyTorch's own autograd makes in the case dtype.
    #[allow(clippy::too_many_arguments)]
    fn compare_with_pytorch(
        &self,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        reference: &ReferenceOutputs,
        cotangents: &Named,
        dtype: DType,
        targets: &Targets,
        along: Option<&Named>,
        failure: &mut CaseFailure,
    ) -> Result<(), String> {
        // With its taps: where a gradient stops, when one does (`judge/backward.rs`).
        let (run, state) = self.run_port_tapped(
            args,
            &forward.state_dict,
            &forward.aliases,
            dtype,
            targets,
            true,
        )?;
        let never_read = state.as_ref().map(|s| s.unused_names()).unwrap_or_default();
        if let Some(state) = &state {
            failure.params = state.request_issues();
            failure.params.extend(crate::answers::params::without_kept(
                state.unused(),
                &forward.kept,
                &self.layer.rename,
            ));
        }
        // A port whose forward already differs computes another function: its gradients cannot
        // match, and that is no news about its backward. Said first.
        if let Some(differs) = forward_differs(&run.outputs, forward, self.layer.tol) {
            failure.gradient_issues.push(differs);
        }
        let losses = Self::leaf_losses(&run.outputs, cotangents)?;
        let port = self.gradients(&run, &Self::total(&losses)?)?;
        let mut present = Vec::new();
        for (name, grad) in port {
            let leaf = format!("grad.{name}");
            let theirs = reference
                .expected
                .iter()
                .find(|(n, _)| *n == leaf)
                .map(|(_, t)| t);
            let all_zero = |t: &HostTensor| t.to_f64().iter().all(|v| *v == 0.0);
            match (grad, theirs) {
                (None, Some(_)) if never_read.contains(&name) => {
                    // The port never reads it (said above, with the parameters): nothing stops
                    // its gradient, there is none to stop.
                    failure.gradient_issues.push(GradientIssue::Other(format!(
                        "`{name}` gets a gradient in PyTorch and none in the port: the port never \
                         reads it"
                    )))
                }
                (None, Some(t)) if !all_zero(t) => failure.gradient_issues.push(
                    GradientIssue::Other(crate::judge::backward::why_no_gradient(&name, &run.taps)),
                ),
                (Some(g), None) => failure.gradient_issues.push(GradientIssue::Other(format!(
                    "the port produces a gradient for `{name}` (max |g| {}) where PyTorch has none",
                    num(g.to_f64().iter().fold(0.0, |m, v| m.max(v.abs())))
                ))),
                (Some(g), Some(_)) => {
                    // At size, PyTorch's answer is the derivative along a direction: so is the
                    // port's, summed in float64 from its gradient and given in the gradient's dtype.
                    let g = match along.and_then(|a| a.iter().find(|(n, _)| *n == name)) {
                        Some((_, u)) => HostTensor::from_floats(
                            vec![],
                            &[dot(&g.to_f64(), &u.to_f64())],
                            g.dtype,
                        ),
                        None => g,
                    };
                    present.push((leaf, g))
                }
                _ => {}
            }
        }
        // Judge against PyTorch's float64 gradient (in the case dtype), with the rounding estimate
        // of PyTorch's own case-dtype gradient; no accuracy rule on top (the target is precise).
        // Where the float64 run is not the same computation (no estimate: NaN), the case-dtype
        // gradient is the reference's answer, as in the forward check.
        let mut compared = reference.clone();
        if let Some(precise) = compared.precise.take() {
            let rounding = compared.rounding.clone().unwrap_or_default();
            for (name, value) in compared.expected.iter_mut() {
                if let Some((_, h)) = precise.iter().find(|(n, _)| n == name) {
                    let e = value.to_f64();
                    let r = rounding
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, r)| r.to_f64())
                        .filter(|r| r.len() == e.len());
                    let target: Vec<f64> = h
                        .to_f64()
                        .into_iter()
                        .enumerate()
                        .map(|(i, h)| match &r {
                            Some(r) if r[i].is_nan() => e[i],
                            _ => h,
                        })
                        .collect();
                    *value = HostTensor::from_floats(h.shape.clone(), &target, value.dtype);
                }
            }
        }
        compared
            .expected
            .retain(|(n, _)| present.iter().any(|(p, _)| p == n));
        failure.leaves = compared.compare(
            &present,
            self.layer.tol,
            crate::judge::compare::GRADIENT_ROUNDING_FACTOR,
        );
        failure.port_outputs = present;
        // What the port was judged against (a failure's artifacts and repro.py use it), with the
        // module's parameters as the port got them.
        compared.state_dict = forward.state_dict.clone();
        failure.reference = Some(compared);
        Ok(())
    }

    /// The port's float64 side of a case.
    fn case64(
        &self,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        cotangents: &Named,
    ) -> Case64 {
        let norm = cotangents
            .iter()
            .map(|(_, t)| dot(&t.to_f64(), &t.to_f64()))
            .sum::<f64>()
            .sqrt();
        let v: Named = cotangents
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    HostTensor::from_f64(
                        t.shape.clone(),
                        &t.to_f64()
                            .iter()
                            .map(|x| x / norm.max(f64::MIN_POSITIVE))
                            .collect::<Vec<_>>(),
                    ),
                )
            })
            .collect();
        Case64 {
            args: args.iter().map(to_f64).collect(),
            state: forward
                .state_dict
                .iter()
                .map(|(n, t)| (n.clone(), to_f64(t)))
                .collect(),
            aliases: forward.aliases.clone(),
            v,
        }
    }

    /// The value of an input or parameter in float64.
    fn value_of(&self, case: &Case64, name: &str) -> HostTensor {
        match self.layer.args.iter().position(|x| x.name == name) {
            Some(i) => case.args[i].clone(),
            None => case
                .state
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .expect("a target"),
        }
    }

    /// The random unit direction of a target.
    fn direction(seed: u64, name: &str, n: usize) -> Vec<f64> {
        let u = Rng::new(seed, &format!("direction.{name}")).normals(n);
        let un = dot(&u, &u).sqrt().max(f64::MIN_POSITIVE);
        u.iter().map(|x| x / un).collect()
    }

    /// L per leaf with one target moved by `step` along `u`.
    fn losses_along(
        &self,
        case: &Case64,
        name: &str,
        u: &[f64],
        step: f64,
    ) -> Result<Vec<f64>, String> {
        let w = self.value_of(case, name);
        let moved = HostTensor::from_f64(
            w.shape.clone(),
            &w.to_f64()
                .iter()
                .zip(u)
                .map(|(x, d)| x + step * d)
                .collect::<Vec<_>>(),
        );
        let run = self.run_moved(case, name, moved)?;
        Self::leaf_losses(&run.outputs, &case.v)?
            .iter()
            .map(|l| l.to_scalar::<f64>().map_err(|e| e.to_string()))
            .collect()
    }

    /// The port's gradients in float64 against central differences: per target the figure
    /// `|analytic − numeric| / allowed`, and what disagrees. A backward that is not deterministic
    /// or does not scale with the cotangent goes straight into `failure`.
    fn finite_differences(
        &self,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        cotangents: &Named,
        params: &CaseParams,
        targets: &Targets,
        failure: &mut CaseFailure,
    ) -> Result<FdFindings, String> {
        let spec = &self.spec;
        let case = self.case64(args, forward, cotangents);
        let v = &case.v;

        // Analytic gradients, twice (they must agree bit for bit), per leaf.
        let gradients_of =
            |leaf: Option<&str>| -> Result<Vec<(String, Option<HostTensor>)>, String> {
                let (run, _) =
                    self.run_port(&case.args, &case.state, &case.aliases, DType::F64, targets)?;
                let losses = Self::leaf_losses(&run.outputs, v)?;
                let picked: Vec<Tensor> = match leaf {
                    Some(l) => v
                        .iter()
                        .zip(&losses)
                        .filter(|((n, _), _)| n == l)
                        .map(|(_, t)| t.clone())
                        .collect(),
                    None => losses,
                };
                self.gradients(&run, &Self::total(&picked)?)
            };
        let first = gradients_of(None)?;
        let second = gradients_of(None)?;
        if first != second {
            failure.gradient_issues.push(GradientIssue::Other(
                "two backward passes on the same inputs give different gradients: the backward is \
                 not deterministic"
                    .into(),
            ));
        }
        // A zero cotangent must give zero gradients.
        {
            let (run, _) =
                self.run_port(&case.args, &case.state, &case.aliases, DType::F64, targets)?;
            let zero: Named = v
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        HostTensor::from_f64(t.shape.clone(), &vec![0.0; t.numel()]),
                    )
                })
                .collect();
            let losses = Self::leaf_losses(&run.outputs, &zero)?;
            for (name, g) in self.gradients(&run, &Self::total(&losses)?)? {
                let max = g.map_or(0.0, |g| {
                    g.to_f64().iter().fold(0.0f64, |m, x| m.max(x.abs()))
                });
                if max != 0.0 {
                    failure.gradient_issues.push(GradientIssue::Other(format!(
                        "a zero cotangent gives `{name}` a non-zero gradient (max |g| {}): the backward \
                         does not scale with the incoming gradient",
                        num(max)
                    )));
                }
            }
        }

        let mut figures = Vec::new();
        let mut issues = Vec::new();
        for (name, grad) in &first {
            let w = self.value_of(&case, name);
            let g = grad
                .as_ref()
                .map_or(vec![0.0; w.numel()], HostTensor::to_f64);
            let u = Self::direction(params.seed, name, w.numel());
            let plus = self.losses_along(&case, name, &u, spec.eps)?;
            let minus = self.losses_along(&case, name, &u, -spec.eps)?;
            let numeric: f64 = plus
                .iter()
                .zip(&minus)
                .map(|(p, m)| (p - m) / (2.0 * spec.eps))
                .sum();
            let analytic = dot(&g, &u);
            let allowed = spec.atol + spec.rtol * numeric.abs();
            let ratio = (analytic - numeric).abs() / allowed;
            figures.push((format!("fd.{name}"), ratio));
            if ratio > 1.0 || spec.mode == GradMode::Full {
                // Which output leaf: the directional derivative of each leaf's loss alone.
                for (k, (leaf, _)) in v.iter().enumerate() {
                    let leaf_grads = gradients_of(Some(leaf))?;
                    let g_leaf = leaf_grads
                        .iter()
                        .find(|(n, _)| n == name)
                        .and_then(|(_, g)| g.as_ref())
                        .map_or(vec![0.0; w.numel()], HostTensor::to_f64);
                    let per_leaf = dot(&g_leaf, &u);
                    let n = (plus[k] - minus[k]) / (2.0 * spec.eps);
                    let allowed = spec.atol + spec.rtol * n.abs();
                    if (per_leaf - n).abs() > allowed || spec.mode == GradMode::Full {
                        let directional = format!(
                            "the port's derivative of sum(`{leaf}` · cotangent) along a \
                             random unit direction is {} in its backward, {} by finite differences \
                             — {}× outside atol {} + rtol {}·|numeric| (eps {})",
                            num(per_leaf),
                            num(n),
                            num((per_leaf - n).abs() / allowed),
                            num(spec.atol),
                            num(spec.rtol),
                            num(spec.eps)
                        );
                        // The Jacobian says which entry, at the cost of a backward per output
                        // element and two forward passes per input element: only on the case
                        // reported (see `locate`), and at size halving directional derivatives
                        // instead (`bisect`).
                        let cost = Self::jacobian_cost(&case, leaf, &w);
                        let located = if self.locate.get()
                            && spec.mode == GradMode::Fast
                            && cost > JACOBIAN_EVALUATIONS
                        {
                            self.bisect(&case, name, k, &g_leaf, &u, cost, spec)?
                        } else if self.locate.get() || spec.mode == GradMode::Full {
                            self.jacobian(&case, name, leaf, &w, spec)?
                        } else {
                            None
                        };
                        let finding = match located {
                            Some(finding) => finding,
                            None if ratio > 1.0 => directional,
                            None => continue,
                        };
                        issues.push(FdDisagreement {
                            target: name.clone(),
                            finding,
                        });
                    }
                }
            }
        }
        Ok((figures, issues))
    }

    /// A note for a disagreement only finite differences see, with its likely reason: the port
    /// computes below float64 (its float64 outputs carry float32's rounding against PyTorch's
    /// float64 result), the loss is not smooth at the scale of ε (finite differences at ε and 10ε
    /// disagree), or PyTorch defines the gradient by convention.
    fn fd_note(
        &self,
        issue: &FdDisagreement,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        cotangents: &Named,
        params: &CaseParams,
    ) -> Note {
        let spec = &self.spec;
        let case = self.case64(args, forward, cotangents);
        let none = Targets {
            args: Vec::new(),
            params: Vec::new(),
        };
        // How far the port's float64 outputs are from PyTorch's float64 result, relatively.
        let below_f64 = (|| -> Option<f64> {
            let (run, _) = self
                .run_port(&case.args, &case.state, &case.aliases, DType::F64, &none)
                .ok()?;
            let precise = forward.precise.as_ref()?;
            let mut worst: f64 = 0.0;
            for (name, h) in precise {
                let port = HostTensor::from_candle(run.outputs.leaf(name).ok()?).ok()?;
                let (p, h) = (port.to_f64(), h.to_f64());
                let scale = h.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
                for (a, b) in p.iter().zip(&h) {
                    worst = worst.max((a - b).abs() / scale);
                }
            }
            Some(worst)
        })();
        let smooth = (|| -> Option<bool> {
            let w = self.value_of(&case, &issue.target);
            let u = Self::direction(params.seed, &issue.target, w.numel());
            let at = |eps: f64| -> Option<f64> {
                let plus = self.losses_along(&case, &issue.target, &u, eps).ok()?;
                let minus = self.losses_along(&case, &issue.target, &u, -eps).ok()?;
                Some(
                    plus.iter()
                        .zip(&minus)
                        .map(|(p, m)| (p - m) / (2.0 * eps))
                        .sum(),
                )
            };
            let (a, b) = (at(spec.eps)?, at(10.0 * spec.eps)?);
            Some((a - b).abs() <= spec.atol + spec.rtol * a.abs())
        })();
        let reason = match (below_f64, smooth) {
            (Some(r), _) if r > 1e-10 => format!(
                "the port computes below float64 (its float64 outputs differ from PyTorch's float64 \
                 result by {} relatively, float32's rounding: a faithful port of the reference's \
                 upcasts, `.to(torch.float32)`), and finite differences at ε = {} then measure \
                 that rounding",
                num(r),
                num(spec.eps)
            ),
            (_, Some(false)) => "the loss is not smooth at the scale of ε here (finite differences \
                                 at ε and 10ε disagree: a kink of relu/abs/clamp/max at this input, \
                                 or a sharp curve such as a norm's eps on near-zero inputs)"
                .to_string(),
            _ => "PyTorch defines this gradient by convention here (an embedding's padding_idx row, \
                  a straight-through estimator, a clamp at its bound)"
                .to_string(),
        };
        let summary = format!(
            "finite differences disagree with both the port's and PyTorch's gradient of `{}`; \
             not a failure: the port agrees with PyTorch's autograd",
            issue.target
        );
        Note {
            detail: format!("{summary}. {issue} — likely reason: {reason}"),
            summary,
        }
    }

    /// What the Jacobian of output leaf `leaf` with respect to `w` costs: port evaluations (a
    /// backward per output element, two forward passes per input element).
    fn jacobian_cost(case: &Case64, leaf: &str, w: &HostTensor) -> usize {
        let n_out = case
            .v
            .iter()
            .find(|(n, _)| n == leaf)
            .map_or(0, |(_, t)| t.numel());
        n_out + 2 * w.numel()
    }

    /// Which entry of `name` the port's backward gets wrong, from directional derivatives alone
    /// (where the Jacobian would take `cost` evaluations): the entries are halved, the half whose
    /// derivative along `u` restricted to it disagrees more with its central difference kept
    /// (the disagreement of a block is the sum of its halves', so one half's difference is
    /// evaluated and the other's follows), until one entry is left, whose partial derivative is
    /// then compared on its own. Two forward passes per halving: `log2(n)` of them. `leaf`: the
    /// output leaf (its index in the cotangents), `g`: the port's gradient of that leaf's loss.
    #[allow(clippy::too_many_arguments)]
    fn bisect(
        &self,
        case: &Case64,
        name: &str,
        leaf: usize,
        g: &[f64],
        u: &[f64],
        cost: usize,
        spec: &GradSpec,
    ) -> Result<Option<String>, String> {
        let disagreement = |lo: usize, hi: usize, direction: &[f64]| -> Result<f64, String> {
            let mut along = vec![0.0; direction.len()];
            along[lo..hi].copy_from_slice(&direction[lo..hi]);
            let plus = self.losses_along(case, name, &along, spec.eps)?;
            let minus = self.losses_along(case, name, &along, -spec.eps)?;
            let numeric = (plus[leaf] - minus[leaf]) / (2.0 * spec.eps);
            Ok(dot(&g[lo..hi], &direction[lo..hi]) - numeric)
        };
        let (mut lo, mut hi) = (0, g.len());
        let mut whole = disagreement(lo, hi, u)?;
        let mut steps = 1;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let left = disagreement(lo, mid, u)?;
            let right = whole - left;
            steps += 1;
            if left.abs() >= right.abs() {
                hi = mid;
                whole = left;
            } else {
                lo = mid;
                whole = right;
            }
        }
        // The one entry, moved alone by eps: its partial derivative both ways.
        let mut unit = vec![0.0; g.len()];
        unit[lo] = 1.0;
        let plus = self.losses_along(case, name, &unit, spec.eps)?;
        let minus = self.losses_along(case, name, &unit, -spec.eps)?;
        let numeric = (plus[leaf] - minus[leaf]) / (2.0 * spec.eps);
        let analytic = g[lo];
        let allowed = spec.atol + spec.rtol * numeric.abs();
        let w = self.value_of(case, name);
        let (leaf_name, _) = &case.v[leaf];
        let ratio = if numeric != 0.0 {
            format!(" ({}× the finite difference)", num(analytic / numeric))
        } else {
            String::new()
        };
        Ok(Some(format!(
            "∂sum(`{leaf_name}` · cotangent)/∂{name}{:?} is {} in the port's backward, {} by finite \
             differences{ratio} — {}× outside atol {} + rtol {}·|numeric| (the entry found by \
             halving directional derivatives, {} pairs of forward passes, where the Jacobian \
             would take {cost} evaluations)",
            unravel(lo, &w.shape),
            num(analytic),
            num(numeric),
            num((analytic - numeric).abs() / allowed),
            num(spec.atol),
            num(spec.rtol),
            steps + 1
        )))
    }

    /// The Jacobian of `leaf` with respect to `name`, analytic (a backward per output element)
    /// against central differences (two forward passes per input element): the worst entry, if it
    /// is outside `atol + rtol·|numeric|` (a finding about `name`, said without it: see
    /// [`FdDisagreement`]).
    fn jacobian(
        &self,
        case: &Case64,
        name: &str,
        leaf: &str,
        w: &HostTensor,
        spec: &GradSpec,
    ) -> Result<Option<String>, String> {
        let w0 = w.to_f64();
        let targets = Targets {
            args: self
                .layer
                .args
                .iter()
                .position(|x| x.name == name)
                .into_iter()
                .collect(),
            params: if self.layer.args.iter().any(|x| x.name == name) {
                Vec::new()
            } else {
                vec![name.to_string()]
            },
        };
        // Analytic rows: one backward per output element.
        let (run, _) =
            self.run_port(&case.args, &case.state, &case.aliases, DType::F64, &targets)?;
        let out_dims = run.outputs.leaf(leaf)?.dims().to_vec();
        let n_out: usize = out_dims.iter().product();
        if let Err(e) = inputs::within_budget(n_out as u128 * w0.len() as u128, || {
            (
                format!(
                    "grad(mode = full) compares whole Jacobians, and the one of `{leaf}` \
                     with respect to `{name}` ({n_out} × {} entries) is too large",
                    w0.len()
                ),
                "use mode = fast, or narrow the dims".to_string(),
            )
        }) {
            // Fast mode only locates a mismatch its directional derivative already reports.
            return Ok((spec.mode == GradMode::Full).then_some(e));
        }
        let mut analytic = vec![vec![0.0; w0.len()]; n_out];
        for (i, row) in analytic.iter_mut().enumerate() {
            let (run, _) =
                self.run_port(&case.args, &case.state, &case.aliases, DType::F64, &targets)?;
            let pick = run
                .outputs
                .leaf(leaf)?
                .flatten_all()
                .and_then(|o| o.get(i))
                .map_err(|e| e.to_string())?;
            if let Some(g) = &self.gradients(&run, &pick)?[0].1 {
                *row = g.to_f64();
            }
        }
        // Numeric columns: two forward passes per input element, all in one job on the port's
        // thread (each call still bounded by the timeout), every call with fresh tensors.
        let moved_arg = self.layer.args.iter().position(|x| x.name == name);
        let group = case
            .aliases
            .iter()
            .find(|g| g.iter().any(|n| n == name))
            .cloned()
            .unwrap_or_else(|| vec![name.to_string()]);
        let columns = Arc::new(Columns {
            port: self.port.port(),
            case: self.port.case(),
            names: self.port.names(),
            module: self.layer.form == Form::Module,
            args: case.args.iter().map(Fresh::of).collect(),
            state: case
                .state
                .iter()
                .map(|(n, t)| {
                    let moves = moved_arg.is_none() && group.contains(n);
                    (n.clone(), Fresh::of(t), moves)
                })
                .collect(),
            aliases: case.aliases.clone(),
            rename: self.layer.rename.clone(),
            moved_arg,
            w0,
            leaf: leaf.to_string(),
            analytic,
            eps: spec.eps,
            atol: spec.atol,
            rtol: spec.rtol,
        });
        // The columns in as many parts as there are cores, one thread each (the parts are
        // judged in order, as if they had run one after the other).
        let n_in = columns.w0.len();
        let parts = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, MAX_PARTS)
            .min(n_in.max(1));
        let job = Arc::new(move |part: usize, beat: &Heartbeat| {
            columns.evaluate(beat, part * n_in / parts..(part + 1) * n_in / parts)
        });
        let worst = match self.port.run_parts("", parts, job) {
            Ok(Ok(parts)) => Worst::of(&parts),
            Ok(Err(ColumnError::Golden(e))) => return Err(e),
            Ok(Err(ColumnError::Port(message))) => {
                self.port.fail(PortFailure {
                    message: message.clone(),
                    panicked: false,
                    stuck: None,
                });
                return Err(format!("the port returned an error: {message}"));
            }
            Err(PortFailure {
                message, panicked, ..
            }) => {
                return Err(if panicked {
                    format!("the port panicked: {message}")
                } else {
                    format!("the port returned an error: {message}")
                })
            }
        };
        let Some(Entry {
            excess,
            i,
            j,
            analytic: a,
            numeric,
        }) = worst.filter(|w| w.excess > 1.0)
        else {
            return Ok(None);
        };
        let ratio = if numeric != 0.0 {
            format!(" ({}× the finite difference)", num(a / numeric))
        } else {
            String::new()
        };
        Ok(Some(format!(
            "∂{leaf}{:?}/∂{name}{:?} is {} in the port's backward, {} by finite differences{ratio} — {}× outside atol {} + rtol {}·|numeric|",
            unravel(i, &out_dims),
            unravel(j, &w.shape),
            num(a),
            num(numeric),
            num(excess),
            num(spec.atol),
            num(spec.rtol)
        )))
    }
}

/// A value the port gets, kept in the form cheapest to hand over afresh on every call.
enum Fresh {
    /// Float64 values and their shape: a copy per call.
    F64(Vec<usize>, Vec<f64>),
    /// Anything else (an integer input), as it travels.
    Other(HostTensor),
}

impl Fresh {
    fn of(t: &HostTensor) -> Self {
        if t.dtype == WireDType::F64 {
            Fresh::F64(t.shape.clone(), t.to_f64())
        } else {
            Fresh::Other(t.clone())
        }
    }

    /// A fresh tensor of these values (of `values` instead, when given).
    fn tensor(&self, values: Option<&[f64]>, device: &Device) -> candle_core::Result<Tensor> {
        match (self, values) {
            (Fresh::F64(shape, v), values) => {
                Tensor::from_vec(values.unwrap_or(v).to_vec(), shape.as_slice(), device)
            }
            (Fresh::Other(h), _) => h.to_candle(device),
        }
    }

    /// A fresh `Var` of these values (of `values` instead, when given).
    fn var(&self, values: Option<&[f64]>, device: &Device) -> candle_core::Result<Var> {
        match (self, values) {
            (Fresh::F64(shape, v), values) => {
                Var::from_vec(values.unwrap_or(v).to_vec(), shape.as_slice(), device)
            }
            (Fresh::Other(h), _) => Var::from_tensor(&h.to_candle(device)?),
        }
    }
}

/// Why a job of Jacobian columns stopped.
enum ColumnError {
    /// The port returned this error.
    Port(String),
    /// Golden could not serve the inputs or read the outputs.
    Golden(String),
}

/// An entry of a Jacobian compared with its central difference.
#[derive(Clone, Copy)]
struct Entry {
    /// `|analytic − numeric| / (atol + rtol·|numeric|)`.
    excess: f64,
    /// The output element.
    i: usize,
    /// The input element.
    j: usize,
    analytic: f64,
    numeric: f64,
}

/// The threads that compute a Jacobian's columns at most.
const MAX_PARTS: usize = 4;

/// What decides the worst entry of a run of Jacobian entries in column-major order: the first,
/// and the first greatest of those that are not NaN.
#[derive(Default)]
struct Worst {
    first: Option<Entry>,
    best: Option<Entry>,
}

impl Worst {
    fn push(&mut self, e: Entry) {
        if self.first.is_none() {
            self.first = Some(e);
        }
        if !e.excess.is_nan() && self.best.is_none_or(|b| e.excess > b.excess) {
            self.best = Some(e);
        }
    }

    /// The worst entry of runs one after the other: the first entry, then each entry whose
    /// excess is strictly greater than the worst's so far (so a NaN first entry stays, and later
    /// NaNs never win) — what one loop over all the entries finds.
    fn of(runs: &[Worst]) -> Option<Entry> {
        let mut worst: Option<Entry> = None;
        for run in runs {
            worst = match worst {
                None => match run.first {
                    Some(first) if first.excess.is_nan() => Some(first),
                    _ => run.best,
                },
                Some(w) if w.excess.is_nan() => Some(w),
                Some(w) => match run.best {
                    Some(b) if b.excess > w.excess => Some(b),
                    _ => Some(w),
                },
            };
        }
        worst
    }
}

/// The numeric side of one Jacobian (an output leaf with respect to an input or parameter), on
/// the port's thread: two forward passes per input element, each with fresh tensors as the port
/// always gets them, compared column by column with the analytic rows.
struct Columns {
    port: SharedPort,
    case: crate::describe::outputs::CaseValues,
    names: Vec<String>,
    /// Whether the port is a module (it gets the state dict).
    module: bool,
    args: Vec<Fresh>,
    /// The state dict, with whether the entry is (a name of) the moved parameter.
    state: Vec<(String, Fresh, bool)>,
    aliases: Vec<Vec<String>>,
    rename: Vec<(String, String)>,
    /// The moved input; `None` when a parameter moves.
    moved_arg: Option<usize>,
    /// The moved input's or parameter's values.
    w0: Vec<f64>,
    leaf: String,
    /// The port's backward, a row per output element.
    analytic: Vec<Vec<f64>>,
    eps: f64,
    atol: f64,
    rtol: f64,
}

impl Columns {
    /// Compare the columns `columns`; stop at the first call that fails.
    fn evaluate(&self, beat: &Heartbeat, columns: Range<usize>) -> Result<Worst, ColumnError> {
        let mut worst = Worst::default();
        let mut moved = self.w0.clone();
        let n_out = self.analytic.len();
        for j in columns {
            if beat.cancelled() {
                break;
            }
            moved[j] = self.w0[j] + self.eps;
            let p = self.outputs(beat, &moved)?;
            moved[j] = self.w0[j] - self.eps;
            let m = self.outputs(beat, &moved)?;
            moved[j] = self.w0[j];
            for i in 0..n_out {
                let numeric = (p[i] - m[i]) / (2.0 * self.eps);
                let analytic = self.analytic[i][j];
                let excess = (analytic - numeric).abs() / (self.atol + self.rtol * numeric.abs());
                worst.push(Entry {
                    excess,
                    i,
                    j,
                    analytic,
                    numeric,
                });
            }
        }
        Ok(worst)
    }

    /// The leaf's values, in float64, with the input or parameter at `moved`.
    fn outputs(&self, beat: &Heartbeat, moved: &[f64]) -> Result<Vec<f64>, ColumnError> {
        let device = Device::Cpu;
        let golden = |e: candle_core::Error| ColumnError::Golden(e.to_string());
        let tensors = self
            .args
            .iter()
            .enumerate()
            .map(|(k, a)| a.tensor((self.moved_arg == Some(k)).then_some(moved), &device))
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(golden)?;
        let state = if self.module {
            let names: Vec<String> = self.state.iter().map(|(n, _, _)| n.clone()).collect();
            Some(
                StateDict::serve_made(
                    &names,
                    &self.aliases,
                    &self.rename,
                    DType::F64,
                    &device,
                    |k| {
                        let (_, value, moves) = &self.state[k];
                        value.var(moves.then_some(moved), &device)
                    },
                )
                .map_err(golden)?,
            )
        } else {
            None
        };
        let inputs = crate::describe::outputs::PortInputs {
            tensors,
            var_builder: state.as_ref().map(StateDict::var_builder),
            case: self.case.clone(),
            names: self.names.clone(),
            schedule: None,
        };
        beat.beat();
        let outputs = (self.port)(&inputs).map_err(ColumnError::Port)?;
        let out = outputs.leaf(&self.leaf).map_err(ColumnError::Golden)?;
        let values = if out.dtype() == DType::F64 {
            out.flatten_all().and_then(|o| o.to_vec1::<f64>())
        } else {
            HostTensor::from_candle(out).map(|h| h.to_f64())
        };
        values.map_err(golden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_gradchecks() {
        let d = GradSpec::default();
        assert_eq!(
            (d.eps, d.atol, d.rtol, d.mode),
            (1e-6, 1e-5, 1e-3, GradMode::Fast)
        );
    }

    #[test]
    fn the_worst_jacobian_entry_of_parts_is_the_one_loop_finds() {
        let mut rng = Rng::new(7, "worst");
        for trial in 0..400 {
            let n = 1 + trial % 9;
            let entries: Vec<Entry> = rng
                .normals(n)
                .iter()
                .enumerate()
                .map(|(j, x)| Entry {
                    // Ties and NaNs, first or later.
                    excess: if x.abs() > 1.5 {
                        f64::NAN
                    } else {
                        (x * 2.0).round()
                    },
                    i: 0,
                    j,
                    analytic: 0.0,
                    numeric: 0.0,
                })
                .collect();
            let mut one: Option<Entry> = None;
            for e in &entries {
                if one.is_none_or(|w| e.excess > w.excess) {
                    one = Some(*e);
                }
            }
            for cut in 0..=n {
                let runs: Vec<Worst> = [&entries[..cut], &entries[cut..]]
                    .iter()
                    .map(|part| {
                        let mut w = Worst::default();
                        part.iter().for_each(|e| w.push(*e));
                        w
                    })
                    .collect();
                assert_eq!(Worst::of(&runs).map(|e| e.j), one.map(|e| e.j));
            }
        }
    }

    #[test]
    fn cotangents_follow_the_seed() {
        let t = inputs::float_tensor(vec![3], &[0.0; 3], DType::F32);
        assert_eq!(
            random_like(&t, 1, "c", DType::F32),
            random_like(&t, 1, "c", DType::F32)
        );
        assert_ne!(
            random_like(&t, 1, "c", DType::F32),
            random_like(&t, 2, "c", DType::F32)
        );
    }
}
