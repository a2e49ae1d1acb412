//! Running a check: generate cases with proptest, run the port and the reference on each, compare,
//! shrink a failure to the smallest case, and collect what the snapshot records.

use crate::artifacts;
use crate::compare::{self, Leaf};
use crate::diagnose;
use crate::env;
use crate::inputs::{self, CaseParams};
use crate::layer::{Form, Layer};
use crate::outputs::{Outputs, PortInputs};
use crate::params::StateDict;
use crate::reference::{dtype_name, ReferenceOutputs};
use crate::report::{CaseFailure, Failure, FailureKind, LeafDiagnosis, VariantMatch};
use crate::results;
use crate::source::{Answer, OpenError, Source};
use crate::wire::HostTensor;
use crate::worker::WorkerError;
use candle_core::{DType, Device};
use proptest::test_runner::{
    Config, FailurePersistence, FileFailurePersistence, RngSeed, TestCaseError, TestError,
    TestRunner,
};
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// The port as the runtime calls it: the macro wraps the user's function in one of these.
pub type Port<'a> = dyn Fn(&PortInputs) -> Result<Outputs, String> + 'a;

/// One passing case, as the snapshot and the results file see it.
#[derive(Clone, Debug)]
pub struct CaseRecord {
    /// The case.
    pub params: CaseParams,
    /// Every leaf's comparison.
    pub leaves: Vec<Leaf>,
}

/// All cases of one dtype.
#[derive(Clone, Debug)]
pub struct DTypeRun {
    /// The dtype.
    pub dtype: DType,
    /// The generated cases, in the order they ran.
    pub cases: Vec<CaseRecord>,
    /// Cases replayed first from proptest's regression file (they passed too). Kept apart so that
    /// the snapshot describes the declared cases whatever the regression file holds.
    pub replayed: Vec<CaseRecord>,
    /// Replay of a partial store: generated cases it has no outputs for (not run).
    pub skipped: usize,
}

/// A passing check.
#[derive(Clone, Debug)]
pub struct Report {
    /// The layer that was checked.
    pub layer: Layer,
    /// Seed the cases were generated from.
    pub seed: u64,
    /// Cases per dtype.
    pub cases: u32,
    /// Whether `GOLDEN_SEED`/`GOLDEN_CASES` changed the declared cases (the snapshot, which describes
    /// the declared ones, is then not asserted).
    pub overridden: bool,
    /// How the reference was reached (`live (python 3.11.7, ...)`, `replay (<store>)`).
    pub source: String,
    /// Per dtype, every case.
    pub runs: Vec<DTypeRun>,
}

enum Outcome {
    Pass(CaseRecord),
    Fail(Box<CaseFailure>),
    /// The worker died or hung: reported as is, not shrunk.
    Fatal(WorkerError),
    /// Replay: the store has nothing for this case.
    Unrecorded,
}

/// The seed of a layer's cases: `GOLDEN_SEED` (default 0) mixed with the layer's name, so that
/// layers of a suite do not all draw the same dims.
fn layer_seed(base: u64, layer: &Layer) -> u64 {
    base ^ inputs::fnv1a(layer.name.as_bytes())
}

/// Run one case: inputs, reference, port, comparison.
fn run_case(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &Port<'_>,
    source: &Source,
) -> Outcome {
    let mut failure = CaseFailure::default();
    let args: Result<Vec<HostTensor>, String> = layer
        .args
        .iter()
        .map(|a| inputs::make_arg(a, params, dtype))
        .collect();
    let args = match args {
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
    let reference = match source.forward(layer, dtype, params, &args) {
        Answer::Outputs(r) => r,
        Answer::Unrecorded => return Outcome::Unrecorded,
        Answer::Failed(e @ WorkerError::Remote(_)) => {
            failure.reference_error = Some(e);
            failure.inputs = named_inputs();
            return Outcome::Fail(Box::new(failure));
        }
        Answer::Failed(e) => return Outcome::Fatal(e),
    };
    match run_port(layer, dtype, params, port, &args, &reference) {
        Outcome::Fail(mut f) => {
            f.inputs = named_inputs();
            f.reference = Some(reference);
            Outcome::Fail(f)
        }
        other => other,
    }
}

fn run_port(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &Port<'_>,
    args: &[HostTensor],
    reference: &ReferenceOutputs,
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
        let state = match layer.form {
            Form::Module => Some(StateDict::new(&reference.state_dict, dtype, &device)?),
            Form::Function => None,
        };
        Ok((tensors, state))
    })();
    let (tensors, state) = match prepared {
        Ok(p) => p,
        Err(e) => {
            failure.inputs_error = Some(format!("could not build the port's inputs: {e}"));
            return Outcome::Fail(Box::new(failure));
        }
    };
    let port_inputs = PortInputs {
        tensors,
        var_builder: state.as_ref().map(StateDict::var_builder),
    };
    let result = catch_unwind(AssertUnwindSafe(|| port(&port_inputs)));
    if let Some(state) = &state {
        failure.params = state.request_issues();
    }
    let outputs = match result {
        Ok(Ok(outputs)) => outputs,
        Ok(Err(e)) => {
            failure.port_error = Some(e);
            return Outcome::Fail(Box::new(failure));
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(a panic without a message)".into());
            failure.port_error = Some(msg);
            failure.port_panicked = true;
            return Outcome::Fail(Box::new(failure));
        }
    };
    if let Some(state) = &state {
        failure.params.extend(state.unused());
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
    let port_host = match port_host {
        Ok(p) => p,
        Err(e) => {
            failure.port_error = Some(e);
            return Outcome::Fail(Box::new(failure));
        }
    };
    failure.leaves = reference.compare(&port_host, layer.tol);
    failure.port_outputs = port_host;
    if failure.params.is_empty() && failure.leaves.iter().all(Leaf::passes) {
        Outcome::Pass(CaseRecord {
            params: params.clone(),
            leaves: failure.leaves,
        })
    } else {
        Outcome::Fail(Box::new(failure))
    }
}

struct Settings {
    mode: env::Mode,
    seed: u64,
    cases: u32,
    overridden: bool,
}

fn settings(layer: &Layer) -> Result<Settings, String> {
    let seed = env::seed()?;
    let cases = env::cases()?;
    Ok(Settings {
        mode: match layer.mode {
            Some(mode) => mode,
            None => env::mode()?,
        },
        seed: seed.unwrap_or(0),
        cases: cases.unwrap_or(layer.cases),
        overridden: seed.is_some() || cases.is_some() || env::case().is_some(),
    })
}

/// Check a port against its reference. `Ok` carries what the snapshot records; `Err` says what
/// failed, on the smallest failing case.
pub fn check(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    let started = Instant::now();
    let result = check_inner(layer, port);
    results::record(layer, &result, started.elapsed());
    result
}

fn versions(info: &serde_json::Value) -> String {
    ["python", "numpy", "torch"]
        .iter()
        .filter_map(|k| info.get(*k)?.as_str().map(|v| format!("{k} {v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_inner(layer: &Layer, port: &Port<'_>) -> Result<Report, Failure> {
    let config_error = |m: String| Failure::new(layer, FailureKind::Config(m));
    layer.validate().map_err(config_error)?;
    let settings = settings(layer).map_err(config_error)?;
    let description = layer.description(settings.cases, settings.seed);
    let (source, info) = Source::open(layer, settings.mode, &description).map_err(|e| match e {
        OpenError::Config(m) => config_error(m),
        OpenError::Setup(e, notes) => {
            let mut f = Failure::new(layer, FailureKind::Setup(e));
            f.notes = notes;
            f
        }
    })?;
    let how = match &source {
        Source::Live(_) => format!("live ({})", versions(&info)),
        Source::Record(..) => format!("live, recording ({})", versions(&info)),
        Source::Replay(store) => format!("replay ({})", store.path.display()),
    };
    if settings.mode == env::Mode::Auto && !source.is_replay() {
        eprintln!("golden: `{}`: {how}", layer.name);
    }
    if matches!(source, Source::Record(..)) {
        // Every generated case goes into the store, even those after a failing one.
        for &dtype in &layer.dtypes {
            record_generated(layer, dtype, &source, &settings);
        }
    }
    let mut runs = Vec::new();
    let mut failure = None;
    if let Some(token) = env::case() {
        match run_one_case(layer, port, &source, &token) {
            Ok(r) => runs = r,
            Err(f) => failure = Some(f),
        }
    } else {
        for &dtype in &layer.dtypes {
            match run_dtype(layer, dtype, port, &source, &settings) {
                Ok(run) => runs.push(run),
                Err(f) => {
                    failure = Some(f);
                    break;
                }
            }
        }
    }
    // The store records the reference, right or wrong port alike.
    match source.finish(layer, &description) {
        Ok(Some(line)) => eprintln!("{line}"),
        Ok(None) => {}
        Err(e) => return Err(config_error(e)),
    }
    if let Some(f) = failure {
        return Err(f);
    }
    Ok(Report {
        layer: layer.clone(),
        seed: settings.seed,
        cases: settings.cases,
        overridden: settings.overridden,
        source: how,
        runs,
    })
}

/// Add what golden can tell about a failed case: the diagnoses that fit (on the smallest case and
/// on the first failing one) and the known variants of the reference the port matches on both.
fn explain(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    failure: &mut Failure,
    first: Option<(CaseParams, Box<CaseFailure>)>,
) {
    let (FailureKind::Case(c), Some(case)) = (&mut failure.kind, &failure.case) else {
        return;
    };
    c.diagnoses = diagnoses(layer, c, case, false);
    c.variants = variant_matches(layer, dtype, source, case, c);
    if source.is_replay() {
        failure.notes.push(
            "note: known variants of the reference (golden_ref.variants) are evaluated live only; \
             this was a replay"
                .into(),
        );
    }
    if let Some((first_case, first_failure)) = first {
        for d in diagnoses(layer, &first_failure, &first_case, true) {
            if !c
                .diagnoses
                .iter()
                .any(|m| m.diagnosis.cause == d.diagnosis.cause)
            {
                c.diagnoses.push(d);
            }
        }
        // A variant must explain both cases: a tiny case alone fits too many.
        let on_first = variant_matches(layer, dtype, source, &first_case, &first_failure);
        c.variants
            .retain(|v| on_first.iter().any(|w| w.name == v.name));
    }
}

/// The known variants of the reference that the port matches on this case (live only).
fn variant_matches(
    layer: &Layer,
    dtype: DType,
    source: &Source,
    case: &CaseParams,
    c: &CaseFailure,
) -> Vec<VariantMatch> {
    if c.reference.is_none() {
        return Vec::new();
    }
    let args: Vec<HostTensor> = c.inputs.iter().map(|(_, t)| t.clone()).collect();
    let Some(Ok(variants)) = source.variants(layer, dtype, case, &args) else {
        return Vec::new();
    };
    let mut matches: Vec<VariantMatch> = variants
        .into_iter()
        .filter_map(|v| {
            let leaves = v.outputs?.compare(&c.port_outputs, layer.tol);
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
            _ => compare::Rule::for_leaf(expected.dtype, layer.tol),
        };
        for diagnosis in diagnose::leaf(port, expected, rounding, rule, &case.sizes(layer)) {
            out.push(LeafDiagnosis {
                leaf: leaf.name.clone(),
                diagnosis,
                on_first_case: first.then(|| case.clone()),
            });
        }
    }
    out
}

/// Write the artifacts of a failed case and end the message with how to use them; the folder's
/// path is the last line.
fn leave_artifacts(layer: &Layer, dtype: DType, failure: &mut Failure) {
    let (FailureKind::Case(c), Some(case)) = (&failure.kind, &failure.case) else {
        return;
    };
    failure.notes.push(format!(
        "re-run exactly this case: {}",
        artifacts::rerun_case_command(layer, dtype, case)
    ));
    match artifacts::write(layer, dtype, case, c) {
        Ok(dir) => failure.notes.push(format!(
            "inputs, outputs and a repro.py that runs the reference again ({} repro.py) are in\n  {}",
            env::python().program.display(),
            dir.display()
        )),
        Err(e) => failure.notes.push(format!("(could not write the failure's artifacts: {e})")),
    }
}

/// `GOLDEN_CASE`: run exactly one case (per dtype, or the dtype it names), no generation.
fn run_one_case(
    layer: &Layer,
    port: &Port<'_>,
    source: &Source,
    token: &str,
) -> Result<Vec<DTypeRun>, Failure> {
    let config_error = |m: String| Failure::new(layer, FailureKind::Config(m));
    let (case_token, only) = match token.rsplit_once(':') {
        Some((rest, d)) if ["f32", "f64", "f16", "bf16"].contains(&d) => (rest, Some(d)),
        _ => (token, None),
    };
    let params = CaseParams::parse(case_token, layer).map_err(config_error)?;
    let mut runs = Vec::new();
    for &dtype in layer
        .dtypes
        .iter()
        .filter(|d| only.is_none_or(|o| o == dtype_name(**d)))
    {
        let failure = |kind| {
            let mut f = Failure::new(layer, kind);
            f.dtype = Some(dtype_name(dtype));
            f.case = Some(params.clone());
            f
        };
        match run_case(layer, dtype, &params, port, source) {
            Outcome::Pass(record) => runs.push(DTypeRun {
                dtype,
                cases: vec![record],
                replayed: Vec::new(),
                skipped: 0,
            }),
            Outcome::Fail(c) => {
                let mut f = failure(FailureKind::Case(c));
                explain(layer, dtype, source, &mut f, None);
                leave_artifacts(layer, dtype, &mut f);
                return Err(f);
            }
            Outcome::Fatal(e) => return Err(failure(FailureKind::Worker(e))),
            Outcome::Unrecorded => {
                return Err(failure(FailureKind::Config(
                    "GOLDEN_CASE names a case the golden store has not recorded; run it live"
                        .into(),
                )))
            }
        }
    }
    Ok(runs)
}

/// The proptest configuration of a check, and how many regression seeds it replays first.
fn runner_config(layer: &Layer, settings: &Settings) -> (Config, usize) {
    let persistence = FileFailurePersistence::SourceParallel("proptest-regressions");
    let source_file = layer.declared.map(|d| d.source_file);
    let replays = source_file.map_or(0, |f| persistence.load_persisted_failures2(Some(f)).len());
    let config = Config {
        cases: settings.cases,
        source_file,
        failure_persistence: source_file.map(|_| Box::new(persistence) as _),
        rng_seed: RngSeed::Fixed(layer_seed(settings.seed, layer)),
        max_shrink_iters: 1024,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    (config, replays)
}

/// Record mode, first pass: the reference on every case the check will generate, port unseen.
fn record_generated(layer: &Layer, dtype: DType, source: &Source, settings: &Settings) {
    let (config, _) = runner_config(layer, settings);
    let mut runner = TestRunner::new(config);
    let _ = runner.run(&inputs::case_strategy(layer), |params| {
        let Ok(args) = layer
            .args
            .iter()
            .map(|a| inputs::make_arg(a, &params, dtype))
            .collect::<Result<Vec<_>, _>>()
        else {
            return Ok(());
        };
        match source.forward(layer, dtype, &params, &args) {
            // A dead worker: stop here, the check itself will report it.
            Answer::Failed(e) if !matches!(e, WorkerError::Remote(_)) => {
                Err(TestCaseError::fail("worker failure"))
            }
            _ => Ok(()),
        }
    });
}

fn run_dtype(
    layer: &Layer,
    dtype: DType,
    port: &Port<'_>,
    source: &Source,
    settings: &Settings,
) -> Result<DTypeRun, Failure> {
    let (config, replays) = runner_config(layer, settings);
    let partial = matches!(source, Source::Replay(store) if store.partial.is_some());
    let mut runner = TestRunner::new(config);
    let records = RefCell::new(Vec::new());
    let first_failure: RefCell<Option<(CaseParams, usize)>> = RefCell::new(None);
    let fatal: RefCell<Option<(CaseParams, FailureKind)>> = RefCell::new(None);
    let shrink_steps = Cell::new(0u32);
    let skipped = Cell::new(0usize);
    let unrecorded_shrinks = Cell::new(0u32);

    let result = runner.run(&inputs::case_strategy(layer), |params| {
        if fatal.borrow().is_some() {
            // The worker died (or the store is stale): stop exercising it, let proptest wind down.
            return Err(TestCaseError::fail("aborted"));
        }
        let shrinking = first_failure.borrow().is_some();
        if shrinking {
            shrink_steps.set(shrink_steps.get() + 1);
        }
        match run_case(layer, dtype, &params, port, source) {
            Outcome::Pass(record) => {
                records.borrow_mut().push(record);
                Ok(())
            }
            Outcome::Fail(f) => {
                first_failure
                    .borrow_mut()
                    .get_or_insert_with(|| (params.clone(), records.borrow().len()));
                Err(TestCaseError::fail(f.headline()))
            }
            Outcome::Fatal(e) => {
                *fatal.borrow_mut() = Some((params, FailureKind::Worker(e)));
                Err(TestCaseError::fail("worker failure"))
            }
            // Replay can only evaluate recorded cases: a shrink candidate that was not recorded
            // counts as passing, so shrinking stops at the smallest recorded failing case.
            Outcome::Unrecorded if shrinking => {
                unrecorded_shrinks.set(unrecorded_shrinks.get() + 1);
                Ok(())
            }
            Outcome::Unrecorded if partial => {
                skipped.set(skipped.get() + 1);
                Ok(())
            }
            Outcome::Unrecorded => {
                let msg = match source {
                    Source::Replay(store) => format!(
                        "the golden store {} has no outputs for a case this check generates                          ({params}): it is out of date; {}",
                        store.path.display(),
                        format_args!(
                            "record it again (needs Python with torch): {}",
                            crate::source::rerun_command(layer, "GOLDEN_MODE=record")
                        )
                    ),
                    _ => unreachable!("only a replay leaves cases unrecorded"),
                };
                *fatal.borrow_mut() = Some((params, FailureKind::Config(msg)));
                Err(TestCaseError::fail("stale store"))
            }
        }
    });

    let failure = |kind, case: CaseParams| {
        let mut f = Failure::new(layer, kind);
        f.dtype = Some(dtype_name(dtype));
        f.case = Some(case);
        f
    };
    match result {
        Ok(()) => {
            let mut cases = records.into_inner();
            let replayed = cases.drain(..replays.min(cases.len())).collect();
            Ok(DTypeRun {
                dtype,
                cases,
                replayed,
                skipped: skipped.get(),
            })
        }
        Err(TestError::Fail(_, minimal)) => {
            if let Some((case, kind)) = fatal.into_inner() {
                return Err(failure(kind, case));
            }
            let (first, passed_before) =
                first_failure.into_inner().expect("a failing case was seen");
            let mut f = match run_case(layer, dtype, &minimal, port, source) {
                Outcome::Fail(c) => failure(FailureKind::Case(c), minimal.clone()),
                Outcome::Fatal(e) => failure(FailureKind::Worker(e), minimal.clone()),
                Outcome::Pass(_) | Outcome::Unrecorded => {
                    // Not reproducible: show the first failure as it happened.
                    let mut f = match run_case(layer, dtype, &first, port, source) {
                        Outcome::Fail(c) => failure(FailureKind::Case(c), first.clone()),
                        Outcome::Fatal(e) => failure(FailureKind::Worker(e), first.clone()),
                        Outcome::Pass(_) | Outcome::Unrecorded => failure(
                            FailureKind::Config(
                                "a case failed and then passed when run again: the port or the \
                                 reference is not deterministic"
                                    .into(),
                            ),
                            first.clone(),
                        ),
                    };
                    f.notes.push(
                        "note: the smallest case found by shrinking passed when run again; the \
                         port or the reference is not deterministic"
                            .into(),
                    );
                    f
                }
            };
            if source.is_replay() && unrecorded_shrinks.get() > 0 {
                f.notes.push(format!(
                    "note: replay shrinks only through recorded cases ({} smaller candidates were \
                     not recorded); live, golden can shrink further",
                    unrecorded_shrinks.get()
                ));
            }
            // Shrinking keeps the failure but can erase its evidence (a bias is invisible with a
            // batch of one): explain it on the first failing case too.
            let first_failure = match (f.case.as_ref() != Some(&first), &f.kind) {
                (true, FailureKind::Case(_)) => {
                    match run_case(layer, dtype, &first, port, source) {
                        Outcome::Fail(c) => Some((first.clone(), c)),
                        _ => None,
                    }
                }
                _ => None,
            };
            explain(layer, dtype, source, &mut f, first_failure);
            f.shrunk_from = Some((first, shrink_steps.get()));
            f.passed_before = passed_before as u32;
            leave_artifacts(layer, dtype, &mut f);
            Err(f)
        }
        Err(TestError::Abort(reason)) => {
            let mut f = Failure::new(
                layer,
                FailureKind::Config(format!("proptest aborted the run: {reason}")),
            );
            f.dtype = Some(dtype_name(dtype));
            Err(f)
        }
    }
}
