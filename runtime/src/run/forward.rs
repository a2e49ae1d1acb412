//! The forward check: the port and the reference on the same inputs, compared leaf by leaf; on a
//! failure, what golden can tell about it (diagnoses, known variants) and the artifacts it leaves.

use crate::answers::live::{ReferenceOutputs, Request, Stage};
use crate::answers::params::StateDict;
use crate::answers::source::{port_state, Answer, Source};
use crate::describe::checks::Kind;
use crate::describe::inputs::{self, CaseParams};
use crate::describe::layer::{Form, Layer, Params};
use crate::describe::outputs::{Outputs, PortInputs};
use crate::describe::schedule::PortSchedule;
use crate::judge::compare::{self, Leaf};
use crate::judge::diagnose;
use crate::judge::speed::Speed;
use crate::python::worker::WorkerError;
use crate::report::failure::{
    CaseFailure, Failure, FailureKind, LeafDiagnosis, PortFault, VariantMatch,
};
use crate::report::issues::ScheduleIssue;
use crate::report::passed::{CaseRecord, Report};
use crate::run::check::{self, AfterFailure, CaseRunner, Outcome, Port};
use crate::run::port::{PortFailure, PortThread};
use crate::run::schedule;
use candle_core::{DType, Device};
use golden_files::HostTensor;

/// Check a port against its reference: `Ok` carries what the snapshot records, `Err` says what
/// failed on the smallest failing case.
pub fn check(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    let layer = &*check::with_budget(layer);
    let mut description = layer.description(check::cases(layer, layer.cases), check::seed());
    description.extend(layer.invariants_line());
    let runner = ForwardRunner {
        layer,
        port: PortThread::of(port, layer),
        trace_written: std::cell::Cell::new(false),
        timed: std::cell::RefCell::new(Vec::new()),
    };
    check::run(layer, Kind::Forward, layer.cases, &description, &runner)
}

/// Runs the forward comparison of a case.
struct ForwardRunner<'a> {
    layer: &'a Layer,
    port: PortThread,
    /// Traced checks leave the first passing case's trace for `golden report`.
    trace_written: std::cell::Cell<bool>,
    /// Per dtype, the passing case the port and the reference are timed on (`run/speed.rs`).
    timed: std::cell::RefCell<Vec<(DType, Timed)>>,
}

/// The passing case a dtype is timed on: a schedule's with both a prefill and decode steps, the
/// longer both the better, then the largest.
struct Timed {
    /// (whether its schedule has decode steps, its prefill's tokens times its decode steps, its
    /// inputs' elements).
    rank: (bool, usize, usize),
    params: CaseParams,
    /// Its answer, without what timing does not need (the outputs but a schedule's tokens and
    /// its steps' shapes, the rounding estimates).
    reference: ReferenceOutputs,
}

impl ForwardRunner<'_> {
    /// Keep a passing case to time if it is the dtype's largest so far.
    fn consider(
        &self,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
        reference: &ReferenceOutputs,
    ) {
        let (prefill, decodes) = params.plan(self.layer).map_or((0, 0), |p| {
            let lengths = p.steps.lengths();
            let decodes = lengths.iter().skip(1).filter(|&&len| len == 1).count();
            (lengths.first().copied().unwrap_or(0), decodes)
        });
        let rank = (
            decodes > 0,
            prefill * decodes,
            args.iter().map(HostTensor::numel).sum::<usize>(),
        );
        let mut timed = self.timed.borrow_mut();
        let slot = timed.iter_mut().find(|(d, _)| *d == dtype);
        if slot.as_ref().is_some_and(|(_, t)| t.rank >= rank) {
            return;
        }
        let kept = ReferenceOutputs {
            expected: reference
                .expected
                .iter()
                .filter(|(n, _)| n == crate::run::schedule::TOKENS || n.starts_with("step."))
                .cloned()
                .collect(),
            rounding: None,
            precise: None,
            ..reference.clone()
        };
        let candidate = Timed {
            rank,
            params: params.clone(),
            reference: kept,
        };
        match slot {
            Some((_, t)) => *t = candidate,
            None => timed.push((dtype, candidate)),
        }
    }
}

impl CaseRunner for ForwardRunner<'_> {
    fn run(&self, source: &Source, dtype: DType, params: &CaseParams) -> Outcome {
        let trace_to = (self.layer.trace && !self.trace_written.get())
            .then(|| crate::report::artifacts::trace_folder(self.layer))
            .flatten();
        // Every case's answer is proven deterministic by the worker itself (its first evaluation
        // in each precision repeated after the others: `evaluate.py`'s `_confirm`); a failing case
        // is asked for again (`run_case`).
        let outcome = run_case_keeping(
            self.layer,
            dtype,
            params,
            &self.port,
            source,
            trace_to.as_deref(),
            &mut |args, reference| self.consider(dtype, params, args, reference),
        );
        if trace_to.is_some() && matches!(outcome, Outcome::Pass(_)) {
            self.trace_written.set(true);
        }
        outcome
    }

    fn speed(&self, source: &Source, dtype: DType, runs: usize) -> Option<Result<Speed, String>> {
        let timed = self.timed.borrow();
        let (_, t) = timed.iter().find(|(d, _)| *d == dtype)?;
        Some(crate::run::speed::measure(
            self.layer,
            dtype,
            &t.params,
            &self.port,
            source,
            &t.reference,
            runs,
        ))
    }

    /// Two: a hypothesis about the numbers is a cause when it holds on two failing cases, and
    /// the smallest one is often too small to test it (one element has no axes to bias).
    fn others_wanted(&self) -> usize {
        2
    }

    fn reference_only(
        &self,
        source: &Source,
        dtype: DType,
        params: &CaseParams,
    ) -> Option<WorkerError> {
        let args = inputs::make_args(self.layer, params, dtype).ok()?;
        let plan = params.plan(self.layer);
        // A whole model's staged evaluation: every stage is recorded, so that a replay answers
        // whichever stage a port's comparison asks for.
        let stages: Vec<Option<Stage>> = match staged(self.layer, dtype) {
            Some(first) => Stage::ALL
                .into_iter()
                .filter(|s| *s >= first)
                .map(Some)
                .collect(),
            None => vec![None],
        };
        stages.into_iter().find_map(|stage| {
            let request = Request::Forward {
                args: &args,
                trace: self.layer.trace,
                twice: false,
                precise: false,
                plan: plan.as_ref(),
                stage,
            };
            source
                .request(self.layer, dtype, params, &request)
                .dead_worker()
        })
    }

    fn finish(
        &self,
        source: &Source,
        dtype: DType,
        failure: &mut Failure,
        others: Vec<(CaseParams, Box<CaseFailure>)>,
        after: &AfterFailure,
    ) {
        // Outputs of another structure are said as such, with their fix: no diagnosis of values.
        let structural =
            matches!(&failure.kind, FailureKind::Case(c) if c.outputs_differ_in_structure());
        if structural {
            check::leave_artifacts(self.layer, Kind::Forward, dtype, failure, after);
            return;
        }
        explain(self.layer, dtype, source, failure, &others, after);
        let passes = |params: &CaseParams| {
            let outcome = run_case(self.layer, dtype, params, &self.port, source, None);
            matches!(outcome, Outcome::Pass(_))
        };
        let other = others.first();
        // A schedule's failure is first matched against mistakes in how a model is driven
        // through time; the reference's own calls (and its configuration) are searched when none
        // holds on two failing cases. A mistake of driving seen on one case only stays as the
        // evidence when that search names nothing.
        if !schedule::explain(self.layer, dtype, source, failure, other) {
            // Each mutant is an evaluation of the case: within the bound after a failure.
            let wanted = !matches!(
                crate::describe::env::mutations(),
                Ok(crate::describe::env::Mutations::Off)
            );
            if wanted && after.take(1, 0, "the mutation diagnosis") {
                let (driving, notes) = match &mut failure.kind {
                    FailureKind::Case(c) => (std::mem::take(&mut c.mutations), failure.notes.len()),
                    _ => (Vec::new(), failure.notes.len()),
                };
                crate::run::mutations::explain(
                    self.layer, dtype, source, &passes, failure, &others,
                );
                if let FailureKind::Case(c) = &mut failure.kind {
                    if c.mutations.is_empty() && !driving.is_empty() {
                        c.mutations = driving;
                        failure.notes.truncate(notes);
                    }
                }
            }
        }
        explain_sampler(self.layer, dtype, source, &self.port, failure);
        check::leave_artifacts(self.layer, Kind::Forward, dtype, failure, after);
    }
}

/// A failing sampler's diagnosis (`run/sampling.rs`): its draws on the failing vector asked again
/// of the port (built from the case's state), against the reference with each mistake of a
/// sampler, and the vector shrunk.
fn explain_sampler(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    port: &PortThread,
    failure: &mut Failure,
) {
    let (FailureKind::Case(c), Some(params)) = (&mut failure.kind, &failure.case) else {
        return;
    };
    let Some(at) = c
        .schedule_issues
        .iter()
        .position(|i| matches!(i, ScheduleIssue::Sampler(_)))
    else {
        return;
    };
    let (Some(reference), Some(schedule)) = (c.reference.clone(), params.plan(layer)) else {
        return;
    };
    let device = Device::Cpu;
    let prepared = (|| -> candle_core::Result<_> {
        let tensors = c
            .inputs
            .iter()
            .map(|(_, t)| t.to_candle(&device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let state = match layer.form {
            Form::Module => Some(StateDict::serve(
                &reference.state_dict,
                &reference.aliases,
                &layer.rename,
                dtype,
                &device,
            )?),
            Form::Function => None,
        };
        Ok((tensors, state))
    })();
    let Ok((tensors, state)) = prepared else {
        return;
    };
    port.enter_case(params);
    let session = |jobs: Vec<crate::describe::sampling::DrawJob>| {
        let n = jobs.len();
        let draws = PortSchedule {
            plan: schedule.clone(),
            forced: None,
            at: std::sync::Arc::default(),
            reference_shapes: Vec::new(),
            draws: Some(std::sync::Arc::new(jobs)),
            beam: None,
        };
        call_port(port, tensors.clone(), state.as_ref(), false, Some(draws))
            .map_err(|f| f.message)
            .and_then(|(o, _)| crate::run::sampling::drawn(&o, n))
    };
    let params = params.clone();
    if let ScheduleIssue::Sampler(finding) = &mut c.schedule_issues[at] {
        crate::run::sampling::explain(layer, source, &params, finding, &session);
    }
}

/// Run one case: inputs, reference, port, comparison. A passing case's trace is written to
/// `trace_to` when given. A failing case is asked for again (live), evaluated twice, and must be
/// answered the same (every answer is proven deterministic within its request by the worker).
pub(crate) fn run_case(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &PortThread,
    source: &Source,
    trace_to: Option<&std::path::Path>,
) -> Outcome {
    run_case_keeping(layer, dtype, params, port, source, trace_to, &mut |_, _| {})
}

/// [`run_case`], giving a passing case's inputs and answer to `keep`.
fn run_case_keeping(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &PortThread,
    source: &Source,
    trace_to: Option<&std::path::Path>,
    keep: &mut dyn FnMut(&[HostTensor], &ReferenceOutputs),
) -> Outcome {
    let mut failure = CaseFailure::default();
    let args = match inputs::make_args(layer, params, dtype) {
        Ok(a) => a,
        Err(e) => {
            failure.inputs_error = Some(e);
            return Outcome::Fail(Box::new(failure));
        }
    };
    let named_inputs = || {
        layer
            .args
            .iter()
            .map(|a| a.name.clone())
            .zip(args.iter().cloned())
            .collect()
    };
    let plan = params.plan(layer);
    let first = staged(layer, dtype);
    let request = |twice, stage| Request::Forward {
        args: &args,
        trace: layer.trace,
        twice,
        precise: false,
        plan: plan.as_ref(),
        stage,
    };
    let answer = source.request(layer, dtype, params, &request(false, first));
    let reference = match Outcome::reference_outputs(answer, &mut failure) {
        Ok(r) => r,
        Err(Outcome::Fail(mut f)) => {
            f.inputs = named_inputs();
            return Outcome::Fail(f);
        }
        Err(outcome) => return outcome,
    };
    // The next stage of a whole model's evaluation, when the comparison needs it.
    let more = |stage: Stage| {
        let answer = source.request(layer, dtype, params, &request(false, Some(stage)));
        Outcome::reference_outputs(answer, &mut CaseFailure::default())
    };
    let staging = first.map(|s| Staging {
        stage: s,
        more: &more,
    });
    match run_port(
        layer, dtype, params, port, &args, &reference, trace_to, staging,
    ) {
        Outcome::Fail(mut f) => {
            f.inputs = named_inputs();
            // A failing case is only the port's fault if the reference answers the same again.
            if source.live().is_some() {
                let again = source.request(layer, dtype, params, &request(true, None));
                if let Answer::Failed(e @ WorkerError::Remote(_)) = again {
                    f.reference_error = Some(e);
                }
            }
            // A schedule's failure keeps the answer as its steps were compared with it.
            f.reference.get_or_insert(reference);
            Outcome::Fail(f)
        }
        passed @ Outcome::Pass(_) => {
            keep(&args, &reference);
            passed
        }
        other => other,
    }
}

/// Whether a check's cases evaluate the reference in stages, and from which: a checkpoint's
/// module is a whole model, each evaluation of it seconds, and a case far inside its tolerance
/// needs no further evaluations ([`Stage`]).
pub(crate) fn staged(layer: &Layer, dtype: DType) -> Option<Stage> {
    (layer.form == Form::Module && matches!(layer.params, Params::Weights(_)))
        .then(|| Stage::first(dtype))
}

/// A case whose reference answer is staged: the stage of the answer at hand, and how to ask for a
/// later one (the same case).
pub(crate) struct Staging<'a> {
    stage: Stage,
    more: &'a dyn Fn(Stage) -> Result<ReferenceOutputs, Outcome>,
}

/// Whether the next stage of the reference's evaluation can change a comparison at `stage`: a
/// leaf's values fail (a rounding term only widens the tolerance), or, at the case dtype's answer
/// alone, the reference has NaN or ±Inf somewhere (the float64 answer says whether the port can be
/// judged there).
fn needs_next(stage: Stage, leaves: &[Leaf], reference: &ReferenceOutputs) -> bool {
    let values_fail = leaves
        .iter()
        .any(|l| !l.passes() && matches!(l.verdict, compare::Verdict::Values(_)));
    let nonfinite = || {
        reference.expected.iter().any(|(_, t)| {
            t.dtype.is_float() && {
                let mut found = false;
                let mut buffer = [0.0f64; 1024];
                let n = t.numel();
                for start in (0..n).step_by(buffer.len()) {
                    let len = buffer.len().min(n - start);
                    t.read_f64_into(start, &mut buffer[..len]);
                    if buffer[..len].iter().any(|x| !x.is_finite()) {
                        found = true;
                        break;
                    }
                }
                found
            }
        })
    };
    values_fail || (stage == Stage::Case && nonfinite())
}

/// The taps a traced call of the port made, in order.
pub(crate) type Taps = Vec<(String, candle_core::Tensor)>;

/// Call the port on `tensors` (and, in module form, a `VarBuilder` over `state`), recording its
/// taps when `trace` is set. The one entry to the port's own code: every check calls it through
/// here, on the port's thread, bounded by the timeout, its panics caught (`port.rs`).
pub(crate) fn call_port(
    port: &PortThread,
    tensors: Vec<candle_core::Tensor>,
    state: Option<&StateDict>,
    trace: bool,
    schedule: Option<PortSchedule>,
) -> Result<(Outputs, Taps), PortFailure> {
    let var_builder = state.map(StateDict::var_builder);
    let f = port.port();
    let case = port.case();
    let names = port.names();
    let (result, taps) = port.run("", move || {
        let inputs = PortInputs {
            tensors,
            var_builder,
            case,
            names,
            schedule,
        };
        if trace {
            crate::judge::trace::record(|| f(&inputs))
        } else {
            (f(&inputs), Vec::new())
        }
    })?;
    match result {
        Ok(outputs) => Ok((outputs, taps)),
        Err(message) => Err(port.fail(PortFailure {
            message,
            panicked: false,
            stuck: None,
        })),
    }
}

/// Call the port on a case and judge its outputs against `reference`; with `staging`, a
/// comparison that the reference's next stage could change asks for it and judges the same
/// outputs again (the port runs once).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_port(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &PortThread,
    args: &[HostTensor],
    reference: &ReferenceOutputs,
    trace_to: Option<&std::path::Path>,
    mut staging: Option<Staging<'_>>,
) -> Outcome {
    let mut failure = CaseFailure {
        precise_error: reference.precise_error.clone(),
        ..CaseFailure::default()
    };
    let device = Device::Cpu;
    let prepared = (|| -> candle_core::Result<_> {
        let tensors = args
            .iter()
            .map(|a| a.to_candle(&device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok((tensors, port_state(layer, dtype, reference, &device)?))
    })();
    let (tensors, state) = match prepared {
        Ok(p) => p,
        Err(e) => {
            failure.inputs_error = Some(format!("could not build the port's inputs: {e}"));
            return Outcome::Fail(Box::new(failure));
        }
    };
    port.enter_case(params);
    let schedule = schedule::port_schedule(layer, params, reference);
    let result = match schedule
        .as_ref()
        .and_then(|s| s.plan.looped.as_ref().map(|l| (s, l)))
    {
        // A step loop: golden calls the port once per step, teacher-forced then free-running.
        Some((s, looped)) => run_loop(port, &tensors, state.as_ref(), params, s, looped, reference),
        None => call_port(
            port,
            tensors.clone(),
            state.as_ref(),
            layer.trace,
            schedule.clone(),
        ),
    };
    if let Some(state) = &state {
        failure.params = state.request_issues();
    }
    let (outputs, taps) = match result {
        Ok(called) => called,
        Err(fault) => {
            fault.report(&mut failure, params);
            if let (Some(s), Some(e)) = (&schedule, failure.port.as_mut()) {
                if fault.stuck.is_some() || fault.panicked {
                    let k = s.at.load(std::sync::atomic::Ordering::Relaxed);
                    e.message_mut()
                        .push_str(&format!(" (at {})", s.plan.steps.describe(k)));
                }
            }
            return Outcome::Fail(Box::new(failure));
        }
    };
    if let Some(state) = &state {
        failure.params.extend(crate::answers::params::without_kept(
            state.unused(),
            &reference.kept,
            &layer.rename,
        ));
        failure
            .params
            .extend(state.unsaved_reads(&reference.unsaved));
    }
    let port_host: Result<Vec<(String, HostTensor)>, String> = outputs
        .0
        .iter()
        .map(|(n, t)| {
            HostTensor::from_candle(t)
                .map(|h| (n.clone(), h))
                .map_err(|e| format!("output `{n}`: {e}"))
        })
        .collect();
    let mut port_host = match port_host.and_then(|mut p| {
        p.extend(taps_as_leaves(&taps)?);
        Ok(p)
    }) {
        Ok(p) => p,
        Err(e) => {
            failure.port = Some(PortFault::Errored(e));
            return Outcome::Fail(Box::new(failure));
        }
    };
    // A schedule: the steps against the cached run and the one-shot forward (`run/steps.rs`).
    let first_run = schedule.as_ref().map(|_| port_host.clone());
    // A later stage of the reference's evaluation, when the comparison asked for one.
    let mut later: Option<ReferenceOutputs> = None;
    let unaligned = schedule.as_ref().map(|_| port_host.clone());
    let original = reference;
    let (reference, schedule_notes) = loop {
        let answer = later.as_ref().unwrap_or(original);
        if let Some(unaligned) = &unaligned {
            port_host = unaligned.clone();
        }
        let (aligned, notes) = match &schedule {
            Some(s) => {
                let (aligned, notes) = schedule::align(answer, &mut port_host, &s.plan, layer.tol);
                (std::borrow::Cow::Owned(aligned), notes)
            }
            None => (std::borrow::Cow::Borrowed(answer), Vec::new()),
        };
        failure.leaves = aligned.compare(&port_host, layer.tol, compare::ROUNDING_FACTOR);
        let next = staging
            .as_ref()
            .filter(|s| needs_next(s.stage, &failure.leaves, &aligned))
            .and_then(|s| s.stage.next().map(|n| (n, s.more)));
        let Some((next, more)) = next else {
            break (aligned, notes);
        };
        match more(next) {
            Ok(answer) => {
                later = Some(answer);
                staging = staging.map(|s| Staging { stage: next, ..s });
            }
            Err(Outcome::Fail(mut f)) => {
                f.port_outputs = port_host;
                return Outcome::Fail(f);
            }
            Err(other) => return other,
        }
    };
    // A failing case keeps the answer of the last stage it was judged against.
    if let (Some(answer), false) = (&later, schedule.is_some()) {
        failure.reference = Some(answer.clone());
    }
    let evaluations = staging.as_ref().map(|s| s.stage);
    // The reference's answer as it came (unaligned), of the last stage judged: the schedule's
    // checks compare the steps with it.
    let answer = later.as_ref().unwrap_or(original);
    let reference = reference.as_ref();
    // Reference points the port did not tap are listed, not failed.
    let (untapped, leaves): (Vec<Leaf>, Vec<Leaf>) = std::mem::take(&mut failure.leaves)
        .into_iter()
        .partition(|l| {
            crate::judge::trace::is_trace(&l.name) && l.verdict == compare::Verdict::MissingInPort
        });
    // Taps the reference has no point for are refused with the names it has, not compared.
    let points: Vec<(&str, &[usize])> = reference
        .expected
        .iter()
        .filter(|(n, _)| crate::judge::trace::is_trace(n))
        .map(|(n, t)| (n.as_str(), t.shape.as_slice()))
        .collect();
    let (unknown, leaves): (Vec<Leaf>, Vec<Leaf>) = leaves.into_iter().partition(|l| {
        crate::judge::trace::is_trace(&l.name) && l.verdict == compare::Verdict::MissingInReference
    });
    failure.unknown_taps = unknown
        .iter()
        .map(|l| {
            let shape = l.port.as_ref().map_or(&[][..], |(s, _)| s.as_slice());
            crate::judge::trace::unknown_tap(&l.name, shape, &points)
        })
        .collect();
    failure.leaves = leaves;
    failure.untapped = untapped.into_iter().map(|l| l.name).collect();
    failure.invariants =
        crate::judge::invariants::check(&layer.invariants, &port_host, &reference.expected);
    failure.port_outputs = port_host;
    let names: Vec<String> = layer.args.iter().map(|a| a.name.clone()).collect();
    failure.notes = crate::report::passed::reference_notes(reference, &names);
    failure.notes.extend(schedule_notes);
    let compared = failure.params.is_empty()
        && failure.unknown_taps.is_empty()
        && failure.leaves.iter().all(Leaf::passes);
    let compared = compared && failure.invariants.is_empty();
    if let (true, Some(s), Some(first_run)) = (compared, &schedule, &first_run) {
        let run = |tensors: Vec<candle_core::Tensor>, schedule| {
            call_port(port, tensors, state.as_ref(), false, Some(schedule))
                .map(|(outputs, _)| outputs)
        };
        let (issues, notes) = schedule_checks(
            layer, dtype, params, args, &tensors, s, first_run, reference, answer, &run,
        );
        failure.schedule_issues = issues;
        failure.notes.extend(notes);
    }
    if schedule.is_some() && !compared {
        failure.reference = Some(reference.clone());
    }
    if compared && failure.schedule_issues.is_empty() {
        if let Some(dir) = trace_to {
            // Best effort: the report shows the trace when it is there.
            let _ = crate::report::artifacts::write_trace(dir, reference, &failure.port_outputs);
        }
        Outcome::Pass(CaseRecord {
            params: params.clone(),
            leaves: failure.leaves,
            figures: Vec::new(),
            notes: failure.notes,
            evaluations,
        })
    } else {
        Outcome::Fail(Box::new(failure))
    }
}

/// The port's taps as leaves `trace.<name>`, each in the dtype the port computed it in: the
/// comparison checks it against the reference's dtype at that point (`judge/trace.rs`), so that an
/// intermediate computed in another precision is found where it happens (casting it to the case
/// dtype, as golden once did, hid exactly that).
fn taps_as_leaves(
    taps: &[(String, candle_core::Tensor)],
) -> Result<Vec<(String, HostTensor)>, String> {
    let names = crate::judge::trace::leaf_names(taps);
    taps.iter()
        .zip(names)
        .map(|((tap, t), name)| {
            HostTensor::from_candle(t)
                .map(|h| (name, h))
                .map_err(|e| format!("tap `{tap}`: {e}"))
        })
        .collect()
}

/// Add what golden can tell about a failed case: the diagnoses that fit (on the smallest case and
/// on other failing ones: a hypothesis is a cause only when it fits on two of them, else evidence)
/// and the known variants of the reference the port matches on the smallest case and the next.
fn explain(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    failure: &mut Failure,
    others: &[(CaseParams, Box<CaseFailure>)],
    after: &AfterFailure,
) {
    if let FailureKind::Case(c) = &failure.kind {
        failure.notes.extend(far_position(layer, c));
    }
    let (FailureKind::Case(c), Some(case)) = (&mut failure.kind, &failure.case) else {
        return;
    };
    let smallest = diagnoses(layer, c, case, false);
    c.other_cases = others.len();
    // Each declared variant is an evaluation of the case: within the bound after a failure.
    let variants = crate::describe::env::variants() && source.live().is_some();
    let variants = variants
        && after.take(
            1 + others.len().min(1) as u128,
            0,
            "the reference's declared variants (if it has any)",
        );
    if variants {
        c.variants = variant_matches(layer, dtype, source, case, c);
    }
    if source.is_replay() && crate::describe::env::variants() {
        failure.notes.push(
            "note: known variants of the reference (golden_ref.variants) are evaluated live only; \
             this was a replay"
                .into(),
        );
    }
    if let Some((other_case, other_failure)) = others.first().filter(|_| variants) {
        // A variant must explain two cases: a tiny case alone fits too many.
        let variants = variant_matches(layer, dtype, source, other_case, other_failure);
        c.variants
            .retain(|v| variants.iter().any(|w| w.name == v.name));
    }
    let mut per_case = vec![smallest];
    per_case.extend(
        others
            .iter()
            .map(|(params, f)| diagnoses(layer, f, params, true)),
    );
    let same = |a: &LeafDiagnosis, b: &LeafDiagnosis| {
        a.leaf == b.leaf && a.diagnosis.kind == b.diagnosis.kind
    };
    // Each diagnosis once, from the first case that shows it; a hypothesis is confirmed when two
    // of the cases show it.
    let mut found: Vec<LeafDiagnosis> = Vec::new();
    for d in per_case.iter().flatten() {
        if found.iter().any(|m| same(m, d)) {
            continue;
        }
        let cases = per_case
            .iter()
            .filter(|ds| ds.iter().any(|e| same(d, e)))
            .count();
        found.push(LeafDiagnosis {
            confirmed: !d.diagnosis.is_hypothesis() || cases >= 2,
            ..d.clone()
        });
    }
    c.diagnoses = found;
}

/// Where the first failing leaf differs most, the position there when an argument is position ids
/// (`~ positions`) and the leaf's leading axes are theirs: long positions show what a short
/// sequence never does.
fn far_position(layer: &Layer, c: &CaseFailure) -> Option<String> {
    let (arg, ids) = layer.args.iter().find_map(|a| {
        matches!(a.dist, crate::describe::layer::Dist::Positions { .. })
            .then(|| c.inputs.iter().find(|(n, _)| *n == a.name))
            .flatten()
    })?;
    let index = c
        .leaves
        .iter()
        .filter(|l| !l.passes())
        .find_map(|l| match &l.verdict {
            compare::Verdict::Values(v) => v.worst.as_ref().map(|w| w.index.clone()),
            _ => None,
        })?;
    let rank = ids.shape.len();
    if index.len() < rank || index.iter().zip(&ids.shape).any(|(i, n)| i >= n) {
        return None;
    }
    let flat = index[..rank]
        .iter()
        .zip(&ids.shape)
        .fold(0usize, |acc, (i, n)| acc * n + i);
    let values = ids.to_i64();
    let position = *values.get(flat)?;
    let furthest = values.iter().copied().max().unwrap_or(position);
    Some(format!(
        "where it differs most, `{arg}` is {position} (this case's positions reach {furthest}): \
         what shows only far into a sequence — a rotary table or positions computed in low \
         precision (bf16 holds whole numbers exactly up to 256, f16 up to 2048), a table built too \
         short — shows there"
    ))
}

/// The known variants of the reference that the port matches on this case (live only).
fn variant_matches(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    case: &CaseParams,
    c: &CaseFailure,
) -> Vec<VariantMatch> {
    if c.reference.is_none() || !crate::describe::env::variants() {
        return Vec::new();
    }
    let args: Vec<HostTensor> = c.inputs.iter().map(|(_, t)| t.clone()).collect();
    let Some(Ok(variants)) = source.variants(layer, dtype, case, &args) else {
        return Vec::new();
    };
    let mut matches: Vec<VariantMatch> = variants
        .into_iter()
        .filter_map(|v| {
            let leaves = v
                .outputs?
                .compare(&c.port_outputs, layer.tol, compare::ROUNDING_FACTOR);
            if leaves.is_empty() || !leaves.iter().all(Leaf::passes) {
                return None;
            }
            let max_diff = leaves
                .iter()
                .filter_map(|l| match &l.verdict {
                    compare::Verdict::Values(v) => v.greatest_abs.as_ref().map(|g| g.diff),
                    _ => None,
                })
                .fold(0.0, f64::max);
            Some(VariantMatch {
                name: v.name,
                fix: v.fix,
                max_diff,
            })
        })
        .collect();
    // Best fit first: close variants (eps 1e-6 and 1e-12) can both fit a case.
    matches.sort_by(|a, b| a.max_diff.total_cmp(&b.max_diff));
    matches
}

/// The likely causes that fit a failed case's failing leaves.
fn diagnoses(layer: &Layer, c: &CaseFailure, case: &CaseParams, first: bool) -> Vec<LeafDiagnosis> {
    let Some(reference) = &c.reference else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for leaf in c.leaves.iter().filter(|l| !l.passes()) {
        let port = c.port_outputs.iter().find(|(n, _)| *n == leaf.name);
        let expected = reference.expected.iter().find(|(n, _)| *n == leaf.name);
        let (Some((_, port)), Some((_, expected))) = (port, expected) else {
            continue;
        };
        let rounding = reference.rounding_of(&leaf.name);
        let rule = match &leaf.verdict {
            compare::Verdict::Values(v) => v.rule,
            _ => compare::Rule::for_leaf(expected.dtype, layer.tol, compare::ROUNDING_FACTOR),
        };
        for diagnosis in diagnose::leaf(port, expected, rounding, rule, &case.sizes(layer)) {
            out.push(LeafDiagnosis {
                leaf: leaf.name.clone(),
                diagnosis,
                on_first_case: first.then(|| case.clone()),
                confirmed: false,
            });
        }
    }
    out
}

/// A step loop's port calls: every step teacher-forced (carried inputs from the reference's
/// previous step, leaves `step.<k>.<leaf>`), then free-running (from its own, `free.<k>.<leaf>`);
/// the port gets the step's index as the dim `step`.
fn run_loop(
    port: &PortThread,
    tensors: &[candle_core::Tensor],
    state: Option<&StateDict>,
    params: &CaseParams,
    schedule: &PortSchedule,
    looped: &crate::describe::schedule::LoopPlan,
    reference: &ReferenceOutputs,
) -> Result<(Outputs, Taps), PortFailure> {
    let count = schedule.plan.steps.chunks.len();
    let golden_error = |message: String| PortFailure {
        message,
        panicked: false,
        stuck: None,
    };
    let mut leaves = Vec::new();
    for (prefix, forced) in [("step", true), ("free", false)] {
        let mut carried: Vec<(usize, candle_core::Tensor)> = Vec::new();
        for k in 0..count {
            schedule.at.store(k, std::sync::atomic::Ordering::Relaxed);
            let mut call =
                crate::run::steps::fresh(tensors).map_err(|e| golden_error(e.to_string()))?;
            for (i, t) in &carried {
                call[*i] = t.copy().map_err(|e| golden_error(e.to_string()))?;
            }
            let mut step = params.clone();
            step.dims.push(("step".to_string(), k));
            port.enter_case(&step);
            let (outputs, _) = call_port(port, call, state, false, None).map_err(|mut f| {
                f.message = format!(
                    "at step {k} ({}): {}",
                    if forced {
                        "teacher-forced"
                    } else {
                        "free-running"
                    },
                    f.message
                );
                f
            })?;
            carried.clear();
            for (i, leaf) in &looped.carry {
                let next = if forced {
                    let name = format!("step.{k}.{leaf}");
                    let Some((_, t)) = reference.expected.iter().find(|(n, _)| *n == name) else {
                        return Err(golden_error(format!(
                            "the reference's step {k} has no `{leaf}` to carry"
                        )));
                    };
                    t.to_candle(&Device::Cpu)
                        .map_err(|e| golden_error(e.to_string()))?
                } else {
                    outputs.leaf(leaf).map_err(golden_error)?.clone()
                };
                carried.push((*i, next));
            }
            leaves.extend(
                outputs
                    .0
                    .into_iter()
                    .map(|(name, t)| (format!("{prefix}.{k}.{name}"), t)),
            );
        }
    }
    port.enter_case(params);
    Ok((Outputs(leaves), Vec::new()))
}

/// What a scheduled case's port must also do once its steps match its reference: keep padding out
/// of its valid outputs (the leakage check: other tokens at the padded positions must not move a
/// valid output by a single bit), and generate the reference's tokens on its own (free-running).
/// Returns the failures and the notes.
#[allow(clippy::too_many_arguments)]
fn schedule_checks(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    args: &[HostTensor],
    tensors: &[candle_core::Tensor],
    schedule: &PortSchedule,
    first_run: &[(String, HostTensor)],
    reference: &ReferenceOutputs,
    answer: &ReferenceOutputs,
    run: &dyn Fn(Vec<candle_core::Tensor>, PortSchedule) -> Result<Outputs, PortFailure>,
) -> (Vec<ScheduleIssue>, Vec<crate::report::passed::Note>) {
    let plan = &schedule.plan;
    let mut issues = Vec::new();
    let mut notes = Vec::new();
    let fresh = || PortSchedule {
        at: std::sync::Arc::default(),
        ..schedule.clone()
    };
    let host = |outputs: Outputs| -> Result<Vec<(String, HostTensor)>, String> {
        outputs
            .0
            .iter()
            .map(|(n, t)| {
                Ok((
                    n.clone(),
                    HostTensor::from_candle(t).map_err(|e| e.to_string())?,
                ))
            })
            .collect()
    };
    if let Some(mask) = &plan.mask {
        let arg = &layer.args[plan.arg];
        let other = CaseParams {
            seed: params.seed ^ 0x5a5a_5a5a_5a5a_5a5a,
            ..params.clone()
        };
        let swapped = inputs::make_arg(arg, &other, dtype)
            .ok()
            .and_then(|o| schedule::with_padding_from(&args[plan.arg], &o, mask, plan.axis));
        if let Some(swapped) = swapped {
            let mut moved = tensors.to_vec();
            match swapped.to_candle(&Device::Cpu) {
                Ok(t) => moved[plan.arg] = t,
                Err(e) => issues.push(ScheduleIssue::CouldNotRun(format!(
                    "golden could not build the leakage check's input: {e}"
                ))),
            }
            match run(moved, fresh()).map_err(|f| f.message).and_then(host) {
                Ok(second) => issues.extend(schedule::leakage(first_run, &second, plan)),
                Err(e) => issues.push(ScheduleIssue::CouldNotRun(format!(
                    "with other tokens at the padded positions (the leakage check), the port \
                     failed: {e}"
                ))),
            }
        }
    }
    // A sampled generation: the port's sampler on the reference's logits (`run/sampling.rs`).
    let mut takes_uniforms = None;
    if plan.sample.is_some() && plan.steps.generate > 0 {
        let session = |jobs: Vec<crate::describe::sampling::DrawJob>| {
            let n = jobs.len();
            let draws = PortSchedule {
                forced: None,
                draws: Some(std::sync::Arc::new(jobs)),
                ..fresh()
            };
            run(tensors.to_vec(), draws)
                .map_err(|f| f.message)
                .and_then(|o| crate::run::sampling::drawn(&o, n))
        };
        let verdict =
            crate::run::sampling::check(plan, answer, &args[plan.arg], params.seed, &session);
        takes_uniforms = verdict.takes_uniforms;
        let failed = !verdict.issues.is_empty();
        issues.extend(verdict.issues);
        notes.extend(verdict.notes);
        if failed {
            return (issues, notes);
        }
    }
    // Beam search: the port's model and beam step from the reference's beams (`run/beams.rs`),
    // in place of the free-running pass (the best beam is not the port's greedy tokens).
    if plan.beams.is_some() && plan.steps.generate > 0 {
        let session = |job: crate::describe::beams::BeamJob| {
            let beam = PortSchedule {
                forced: None,
                beam: Some(std::sync::Arc::new(job)),
                ..fresh()
            };
            run(tensors.to_vec(), beam)
                .map_err(|f| f.message)
                .and_then(host)
        };
        let verdict = crate::run::beams::check(plan, answer, layer.tol, &session);
        issues.extend(verdict.issues);
        notes.extend(verdict.notes);
        return (issues, notes);
    }
    if plan.steps.generate > 0 {
        let free = PortSchedule {
            forced: None,
            ..fresh()
        };
        match run(tensors.to_vec(), free)
            .map_err(|f| f.message)
            .and_then(host)
        {
            Ok(outputs) => {
                let verdict = if plan.sample.is_some() {
                    crate::run::sampling::free_running(&outputs, answer, plan, takes_uniforms)
                } else {
                    schedule::free_running(
                        &outputs,
                        schedule.forced.as_ref(),
                        reference,
                        plan,
                        layer.tol,
                    )
                };
                match verdict {
                    Ok(note) => notes.push(note),
                    Err(issue) => issues.push(issue),
                }
            }
            Err(e) => issues.push(ScheduleIssue::CouldNotRun(format!(
                "generating on its own (free-running), the port failed: {e}"
            ))),
        }
    }
    (issues, notes)
}
