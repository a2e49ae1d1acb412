//! The gradient check: `#[golden_layer(grad)]` generates `#[test] fn gradients()`.
//!
//! On every generated case the port's gradients of `L = Σ sum(out · cotangent)` (a random cotangent
//! per output leaf, from the case seed) are checked two independent ways:
//!
//! * **Against finite differences**, on the port alone, in float64 — no Python. For each input (and,
//!   in module form, each parameter) `w`, a random unit direction `u`: the analytic `⟨∇_w L, u⟩`
//!   must match `(L(w + εu) − L(w − εu)) / 2ε` within `atol + rtol·|numeric|` (gradcheck's fast
//!   mode; a few forward passes whatever the size). When it does not, golden computes the Jacobian of
//!   the failing (input, output) pair element by element and reports the worst entry. `mode = full`
//!   always compares whole Jacobians. Also: a zero cotangent must give zero gradients, and two
//!   backward passes the same ones. float64, because in float32 the truncation and rounding errors
//!   of a difference quotient (`u/ε` for ε = 1e-6 is ~6e-2) swamp the errors a check must find.
//! * **Against PyTorch's autograd**, in the case dtype, with the same cotangents: leaf by leaf with
//!   the forward check's rule (`grad.x`, `grad.fc1.weight`). A gradient PyTorch has and the port
//!   has not is named with the usual cause: a fused op without backward, or a detach.

use crate::answers::live::{Named, ReferenceOutputs, Request};
use crate::answers::params::StateDict;
use crate::answers::source::{Answer, Source};
use crate::describe::checks::{GradMode, GradSpec, Kind};
use crate::describe::inputs::{self, CaseParams, Rng};
use crate::describe::layer::{Form, Layer};
use crate::describe::numbers::num;
use crate::describe::outputs::Outputs;
use crate::judge::compare::unravel;
use crate::python::worker::WorkerError;
use crate::report::failure::{CaseFailure, Failure};
use crate::report::passed::{CaseRecord, Report};
use crate::run::check::{self, CaseRunner, Outcome, Port};
use crate::run::forward::call_port;
use crate::run::port::{PortFailure, PortThread};
use candle_core::{DType, Device, Tensor, Var};
use golden_files::HostTensor;

/// Check a port's gradients (the layer's `grad` options, or the defaults).
pub fn check(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    let spec = layer.grad.clone().unwrap_or_default();
    let description = format!(
        "{}{}\n",
        layer.description(check::cases(layer, spec.cases), check::seed()),
        spec.describe()
    );
    let runner = GradRunner {
        layer,
        port: PortThread::new(port, check::port_timeout(layer)),
        spec,
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
        &Request::Forward { args, trace: false },
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
}

/// What gradients are asked for, by name.
struct Targets {
    /// Indices of the inputs to differentiate.
    args: Vec<usize>,
    /// Parameters to differentiate (module form).
    params: Vec<String>,
}

impl GradRunner<'_> {
    fn targets(&self, state_dict: &Named, buffers: &[String]) -> Targets {
        let wanted = |name: &str| {
            self.spec
                .wrt
                .as_ref()
                .is_none_or(|w| w.iter().any(|n| n == name))
        };
        let args = (0..self.layer.args.len())
            .filter(|&i| self.layer.args[i].dist.is_float() && wanted(&self.layer.args[i].name))
            .collect();
        let params = state_dict
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !buffers.contains(n) && wanted(n))
            .collect();
        Targets { args, params }
    }

    /// Run the port with the wrt inputs and parameters as Vars.
    fn run_port(
        &self,
        args: &[HostTensor],
        state_dict: &Named,
        dtype: DType,
        targets: &Targets,
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
            Form::Module => {
                Some(StateDict::new(state_dict, dtype, &device).map_err(|e| e.to_string())?)
            }
            Form::Function => None,
        };
        if let Some(state) = &state {
            let data = state.var_map().data().lock().unwrap();
            for name in &targets.params {
                if let Some(var) = data.get(name) {
                    vars.push((name.clone(), var.clone()));
                }
            }
        }
        let (outputs, _) = call_port(&self.port, tensors, state.as_ref(), false).map_err(
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
        Ok((PortRun { outputs, vars }, state))
    }

    /// PyTorch's gradients of `Σ sum(out · cotangent)` on one case, for the same targets.
    fn reference_gradients(
        &self,
        source: &Source,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
        cotangents: &Named,
        targets: &Targets,
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
        };
        source.request(layer, dtype, params, &request)
    }

    /// The port in f64 with the input or parameter `name` replaced by `moved`, differentiating
    /// nothing: one evaluation of a finite difference.
    fn run_moved(
        &self,
        args64: &[HostTensor],
        state64: &Named,
        name: &str,
        moved: HostTensor,
    ) -> Result<PortRun, String> {
        let mut args = args64.to_vec();
        let mut state = state64.clone();
        if let Some(i) = self.layer.args.iter().position(|x| x.name == name) {
            args[i] = moved;
        } else if let Some(entry) = state.iter_mut().find(|(n, _)| n == name) {
            entry.1 = moved;
        }
        let none = Targets {
            args: Vec::new(),
            params: Vec::new(),
        };
        Ok(self.run_port(&args, &state, DType::F64, &none)?.0)
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
        let targets = self.targets(&forward.state_dict, &forward.buffers);
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
        let answer = self.reference_gradients(source, dtype, params, &args, &cotangents, &targets);
        let reference = match Outcome::reference_outputs(answer, &mut failure) {
            Ok(r) => r,
            Err(outcome) => return outcome,
        };
        failure.reference = Some(reference.clone());
        match self.compare_with_pytorch(
            &args,
            &forward,
            &reference,
            &cotangents,
            dtype,
            &targets,
            &mut failure,
        ) {
            Ok(()) => {}
            Err(e) => {
                // The port's own failure (a panic, a call that did not return) as such.
                match self.port.take_fault() {
                    Some(fault) => fault.report(&mut failure, params),
                    None => failure.port_error = Some(e),
                }
                return Outcome::Fail(Box::new(failure));
            }
        }
        let mut figures = Vec::new();
        match self.finite_differences(&args, &forward, &cotangents, params, &targets, &mut failure)
        {
            Ok(f) => figures = f,
            Err(e) => match self.port.take_fault() {
                Some(fault) if fault.stuck.is_some() => {
                    fault.report(&mut failure, params);
                    return Outcome::Fail(Box::new(failure));
                }
                _ => failure.gradient_issues.push(format!(
                    "finite differences run the port in float64, and there it fails: {e} (a fused \
                     kernel without an f64 version? cast to the input's dtype rather than to f32)"
                )),
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
            })
        } else {
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
        let cotangents = cotangents(&forward.expected, params.seed, dtype);
        let targets = self.targets(&forward.state_dict, &forward.buffers);
        self.reference_gradients(source, dtype, params, &args, &cotangents, &targets)
            .dead_worker()
    }

    fn finish(
        &self,
        _: &Source,
        dtype: DType,
        failure: &mut Failure,
        first: Option<(CaseParams, Box<CaseFailure>)>,
    ) {
        // The smallest case can hide what the first one showed (zero inputs give zero gradients
        // on both sides): add the first case's own findings.
        if let (crate::report::failure::FailureKind::Case(c), Some((case, first))) =
            (&mut failure.kind, first)
        {
            for issue in first.gradient_issues {
                if !c.gradient_issues.contains(&issue) {
                    c.gradient_issues
                        .push(format!("on the first failing case ({case}): {issue}"));
                }
            }
        }
        check::leave_artifacts(self.layer, Kind::Gradients, dtype, failure);
    }
}

impl GradRunner<'_> {
    /// The port's gradients in the case dtype against PyTorch's.
    #[allow(clippy::too_many_arguments)]
    fn compare_with_pytorch(
        &self,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        reference: &ReferenceOutputs,
        cotangents: &Named,
        dtype: DType,
        targets: &Targets,
        failure: &mut CaseFailure,
    ) -> Result<(), String> {
        let (run, state) = self.run_port(args, &forward.state_dict, dtype, targets)?;
        if let Some(state) = &state {
            failure.params = state.request_issues();
            failure.params.extend(state.unused());
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
                (None, Some(t)) if !all_zero(t) => failure.gradient_issues.push(format!(
                    "`{name}` gets a gradient in PyTorch and none in the port: the gradient stops \
                     somewhere, usually at a fused op without backward (candle's \
                     LayerNorm::forward, ops::layer_norm, ops::rms_norm, ops::softmax_last_dim, \
                     ops::sdpa) or at a detach"
                )),
                (Some(g), None) => failure.gradient_issues.push(format!(
                    "the port produces a gradient for `{name}` (max |g| {}) where PyTorch has none",
                    num(g.to_f64().iter().fold(0.0, |m, v| m.max(v.abs())))
                )),
                (Some(g), Some(_)) => present.push((leaf, g)),
                _ => {}
            }
        }
        // Compare what both sides have, with the forward check's rule.
        let mut compared = reference.clone();
        compared
            .expected
            .retain(|(n, _)| present.iter().any(|(p, _)| p == n));
        failure.leaves = compared.compare(
            &present,
            self.layer.tol,
            crate::judge::compare::GRADIENT_ROUNDING_FACTOR,
        );
        failure.port_outputs = present;
        Ok(())
    }

    /// The port's gradients in float64 against central differences.
    fn finite_differences(
        &self,
        args: &[HostTensor],
        forward: &ReferenceOutputs,
        cotangents: &Named,
        params: &CaseParams,
        targets: &Targets,
        failure: &mut CaseFailure,
    ) -> Result<Vec<(String, f64)>, String> {
        let spec = &self.spec;
        let args64: Vec<HostTensor> = args.iter().map(to_f64).collect();
        let state64: Named = forward
            .state_dict
            .iter()
            .map(|(n, t)| (n.clone(), to_f64(t)))
            .collect();
        // Unit-norm cotangent over all leaves.
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

        // Analytic gradients, twice (they must agree bit for bit), per leaf.
        let gradients_of =
            |leaf: Option<&str>| -> Result<Vec<(String, Option<HostTensor>)>, String> {
                let (run, _) = self.run_port(&args64, &state64, DType::F64, targets)?;
                let losses = Self::leaf_losses(&run.outputs, &v)?;
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
            failure.gradient_issues.push(
                "two backward passes on the same inputs give different gradients: the backward is \
                 not deterministic"
                    .into(),
            );
        }
        // A zero cotangent must give zero gradients.
        {
            let (run, _) = self.run_port(&args64, &state64, DType::F64, targets)?;
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
                    failure.gradient_issues.push(format!(
                        "a zero cotangent gives `{name}` a non-zero gradient (max |g| {}): the backward \
                         does not scale with the incoming gradient",
                        num(max)
                    ));
                }
            }
        }

        // L per leaf at inputs with one target moved.
        let losses_at = |name: &str, moved: HostTensor| -> Result<Vec<f64>, String> {
            let run = self.run_moved(&args64, &state64, name, moved)?;
            Self::leaf_losses(&run.outputs, &v)?
                .iter()
                .map(|l| l.to_scalar::<f64>().map_err(|e| e.to_string()))
                .collect()
        };
        let value_of = |name: &str| -> HostTensor {
            match self.layer.args.iter().position(|x| x.name == name) {
                Some(i) => args64[i].clone(),
                None => state64
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
                    .expect("a target"),
            }
        };

        let mut figures = Vec::new();
        for (name, grad) in &first {
            let w = value_of(name);
            let w0 = w.to_f64();
            let g = grad
                .as_ref()
                .map_or(vec![0.0; w0.len()], HostTensor::to_f64);
            let u = Rng::new(params.seed, &format!("direction.{name}")).normals(w0.len());
            let un = dot(&u, &u).sqrt().max(f64::MIN_POSITIVE);
            let u: Vec<f64> = u.iter().map(|x| x / un).collect();
            let shifted = |sign: f64| {
                HostTensor::from_f64(
                    w.shape.clone(),
                    &w0.iter()
                        .zip(&u)
                        .map(|(x, d)| x + sign * spec.eps * d)
                        .collect::<Vec<_>>(),
                )
            };
            let plus = losses_at(name, shifted(1.0))?;
            let minus = losses_at(name, shifted(-1.0))?;
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
                        .map_or(vec![0.0; w0.len()], HostTensor::to_f64);
                    let per_leaf = dot(&g_leaf, &u);
                    let n = (plus[k] - minus[k]) / (2.0 * spec.eps);
                    if (per_leaf - n).abs() > spec.atol + spec.rtol * n.abs()
                        || spec.mode == GradMode::Full
                    {
                        if let Some(issue) =
                            self.jacobian(&args64, &state64, name, leaf, &w, spec)?
                        {
                            failure.gradient_issues.push(issue);
                        } else if ratio > 1.0 {
                            failure.gradient_issues.push(format!(
                                "`{name}`: the port's directional derivative along a random u for `{leaf}` is {} where finite differences give {} (eps {})",
                                num(per_leaf), num(n), num(spec.eps)
                            ));
                        }
                    }
                }
            }
        }
        Ok(figures)
    }

    /// The Jacobian of `leaf` with respect to `name`, analytic (a backward per output element)
    /// against central differences (two forward passes per input element): the worst entry, if it
    /// is outside `atol + rtol·|numeric|`.
    fn jacobian(
        &self,
        args64: &[HostTensor],
        state64: &Named,
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
        let (run, _) = self.run_port(args64, state64, DType::F64, &targets)?;
        let out_dims = run.outputs.leaf(leaf)?.dims().to_vec();
        let n_out: usize = out_dims.iter().product();
        if let Err(e) = inputs::within_budget(n_out as u128 * w0.len() as u128, || {
            (
                format!(
                    "`{name}`: grad(mode = full) compares whole Jacobians, and the one of `{leaf}` \
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
            let (run, _) = self.run_port(args64, state64, DType::F64, &targets)?;
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
        // Numeric columns: two forward passes per input element.
        let mut worst: Option<(f64, usize, usize, f64, f64)> = None;
        for j in 0..w0.len() {
            let at = |sign: f64| -> Result<Vec<f64>, String> {
                let mut moved = w0.clone();
                moved[j] += sign * spec.eps;
                let moved = HostTensor::from_f64(w.shape.clone(), &moved);
                let run = self.run_moved(args64, state64, name, moved)?;
                HostTensor::from_candle(run.outputs.leaf(leaf)?)
                    .map(|h| h.to_f64())
                    .map_err(|e| e.to_string())
            };
            let (p, m) = (at(1.0)?, at(-1.0)?);
            for i in 0..n_out {
                let numeric = (p[i] - m[i]) / (2.0 * spec.eps);
                let a = analytic[i][j];
                let excess = (a - numeric).abs() / (spec.atol + spec.rtol * numeric.abs());
                if worst.is_none_or(|w| excess > w.0) {
                    worst = Some((excess, i, j, a, numeric));
                }
            }
        }
        let Some((excess, i, j, a, numeric)) = worst.filter(|w| w.0 > 1.0) else {
            return Ok(None);
        };
        let ratio = if numeric != 0.0 {
            format!(" ({}× the finite difference)", num(a / numeric))
        } else {
            String::new()
        };
        Ok(Some(format!(
            "`{name}`: ∂{leaf}{:?}/∂{name}{:?} is {} in the port's backward, {} by finite differences{ratio} — {}× outside atol {} + rtol {}·|numeric|",
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
