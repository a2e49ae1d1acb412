//! Running a check: open the reference's source, generate cases with proptest, run each (a
//! `CaseRunner` says what a case is for this kind of check), shrink a failure to the smallest
//! case, and collect what the snapshot records.
//!
//! The kinds of check: the forward comparison (`forward.rs`) and the gradient check
//! (`gradients.rs`) share everything here; the overfit check (`overfit.rs`) runs one fixed batch.

use crate::answers::live::ReferenceOutputs;
use crate::answers::source::{Answer, OpenError, Source, Target, Via};
use crate::describe::checks::Kind;
use crate::describe::env;
use crate::describe::inputs::{self, CaseParams};
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::judge::speed::{Speed, TooSlow};
use crate::python::worker::{RemoteKind, WorkerError};
use crate::report::artifacts;
use crate::report::failure::{CaseFailure, Failure, FailureKind, PortFault};
use crate::report::passed::{CaseRecord, DTypeRun, Report};
use crate::report::results;
use crate::run::port::{catching, PanicScope};
use crate::run::regressions::{Regressions, Saved};
use candle_core::DType;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// The port as the runtime calls it: the macro wraps the user's function in one of these (see
/// [`PortFn`](crate::run::port::PortFn) for what it must be).
pub use crate::run::port::Port;

/// What running one case found.
pub(crate) enum Outcome {
    Pass(CaseRecord),
    Fail(Box<CaseFailure>),
    /// The worker died or hung: reported as is, not shrunk.
    Fatal(WorkerError),
    /// Replay: the store has nothing for this case.
    Unrecorded,
}

impl Outcome {
    /// The reference's outputs for a case, or what the case comes to without them: not in the
    /// store, a failing case when the reference raised (`failure` with its error), or fatal when
    /// the worker itself is gone or the checkpoint cannot serve (changed on disk: no case does).
    pub(crate) fn reference_outputs(
        answer: Answer,
        failure: &mut CaseFailure,
    ) -> Result<ReferenceOutputs, Outcome> {
        match answer {
            Answer::Outputs(r) => Ok(r),
            Answer::Unrecorded => Err(Outcome::Unrecorded),
            Answer::Failed(WorkerError::Remote(e)) if e.kind == RemoteKind::Weights => {
                Err(Outcome::Fatal(WorkerError::Remote(e)))
            }
            Answer::Failed(e @ WorkerError::Remote(_)) => {
                failure.reference_error = Some(e);
                Err(Outcome::Fail(Box::new(std::mem::take(failure))))
            }
            Answer::Failed(e) => Err(Outcome::Fatal(e)),
        }
    }
}

/// What one kind of check does with a case.
pub(crate) trait CaseRunner {
    /// The port and the reference on one case.
    fn run(&self, source: &Source, dtype: DType, params: &CaseParams) -> Outcome;
    /// Record mode: everything this case asks of the reference, the port unseen, so that the
    /// store holds every generated case even when the port fails early. `Some` for a dead worker.
    fn reference_only(
        &self,
        source: &Source,
        dtype: DType,
        params: &CaseParams,
    ) -> Option<WorkerError>;
    /// The final failure: add what can be told about it, given other failing cases too (the
    /// first one first when shrinking found a smaller one; see `other_failures`), within what is
    /// left of `after` (each evaluation of about the failing case's size takes one case of it).
    fn finish(
        &self,
        source: &Source,
        dtype: DType,
        failure: &mut Failure,
        others: Vec<(CaseParams, Box<CaseFailure>)>,
        after: &AfterFailure,
    );
    /// How many other failing cases `finish` wants.
    fn others_wanted(&self) -> usize {
        1
    }

    /// Once a dtype's cases passed: how fast and how big the port is beside the reference on one
    /// of them, `runs` timed runs on each side (`run/speed.rs`); `None` for a kind of check that
    /// is not timed, `Err` for why this one could not be.
    fn speed(
        &self,
        _source: &Source,
        _dtype: DType,
        _runs: usize,
    ) -> Option<Result<Speed, String>> {
        None
    }
}

/// Millions of elements golden may evaluate after a check's first failure, by default
/// (`GOLDEN_FAILURE_BUDGET`): see [`AfterFailure`].
pub const DEFAULT_FAILURE_BUDGET: f64 = 32.0;

/// What golden may still evaluate after a check's first failure. Shrinking, another failing case,
/// the diagnoses of each, the known variants and the mutation diagnosis each evaluate about one
/// case of the failing output's size again, so the work after a failure grew with that size: a
/// failing 200 MB output ran past 200 s after its failure. It is bounded by the output's size:
/// `GOLDEN_FAILURE_BUDGET` million elements in all (default [`DEFAULT_FAILURE_BUDGET`]), a case
/// counted by its output's elements. A check's usual outputs (thousands of elements) never reach
/// it; one of millions gets what fits, and the failure says what was skipped.
pub struct AfterFailure {
    budget: u128,
    /// `GOLDEN_FAILURE_BUDGET` as set (`None`: the default).
    setting: Option<String>,
    /// The first failing case's output elements: what one more case costs.
    unit: Cell<u128>,
    spent: Cell<u128>,
    skipped: RefCell<Vec<String>>,
}

impl AfterFailure {
    /// A budget of `budget` elements; `setting` is `GOLDEN_FAILURE_BUDGET` as set.
    pub(crate) fn new(budget: u128, setting: Option<String>) -> Self {
        AfterFailure {
            budget,
            setting,
            unit: Cell::new(1),
            spent: Cell::new(0),
            skipped: RefCell::new(Vec::new()),
        }
    }

    /// The first failure: its output's elements are what each further case costs.
    fn start(&self, elements: u128) {
        self.unit.set(elements.max(1));
    }

    /// Whether `cases` more cases of the failing size fit, keeping `reserve` more for what must
    /// follow; they are charged if so, else `what` is said to be skipped.
    pub(crate) fn take(&self, cases: u128, reserve: u128, what: &str) -> bool {
        let unit = self.unit.get();
        let fits = self.spent.get() + (cases + reserve) * unit <= self.budget;
        if fits {
            self.spent.set(self.spent.get() + cases * unit);
        } else {
            self.skip(what);
        }
        fits
    }

    /// Charge what must be evaluated anyway (the smallest case's failure, its diagnosis).
    fn charge(&self, cases: u128) {
        self.spent.set(self.spent.get() + cases * self.unit.get());
    }

    /// Whether a case of `elements` fits, keeping `reserve` cases of the failing size.
    fn fits_elements(&self, elements: u128, reserve: u128) -> bool {
        self.spent.get() + elements + reserve * self.unit.get() <= self.budget
    }

    /// Charge a case of `elements`.
    fn charge_elements(&self, elements: u128) {
        self.spent.set(self.spent.get() + elements);
    }

    /// Say that `what` was skipped (once).
    pub(crate) fn skip(&self, what: &str) {
        let mut skipped = self.skipped.borrow_mut();
        if !skipped.iter().any(|s| s == what) {
            skipped.push(what.to_string());
        }
    }

    /// What a failure says when the bound skipped something.
    pub(crate) fn note(&self) -> Option<String> {
        let skipped = self.skipped.borrow();
        if skipped.is_empty() {
            return None;
        }
        let unit = self.unit.get();
        let setting = match &self.setting {
            Some(v) => format!("GOLDEN_FAILURE_BUDGET={v}"),
            None => format!("GOLDEN_FAILURE_BUDGET, default {DEFAULT_FAILURE_BUDGET}"),
        };
        Some(format!(
            "note: the failing output has {unit} elements, and what golden evaluates after a \
             failure is bounded by the output's size ({setting}: {} elements, about {} cases of \
             this size): skipped {}. GOLDEN_FAILURE_BUDGET=<millions of elements> raises the \
             bound",
            self.budget,
            crate::describe::numbers::num_sig(self.budget as f64 / unit as f64, 2),
            skipped.join("; ")
        ))
    }
}

/// The elements of a case's outputs, as its comparison saw them (the reference's shapes).
fn output_elements(leaves: &[crate::judge::compare::Leaf]) -> u128 {
    leaves
        .iter()
        .filter_map(|l| l.reference.as_ref().or(l.port.as_ref()))
        .map(|(shape, _)| inputs::elements(shape))
        .sum()
}

/// The elements an outcome's case evaluated: its outputs (its inputs when it has none).
fn outcome_elements(outcome: &Outcome) -> u128 {
    match outcome {
        Outcome::Pass(record) => output_elements(&record.leaves),
        Outcome::Fail(f) => {
            output_elements(&f.leaves).max(f.inputs.iter().map(|(_, t)| t.numel() as u128).sum())
        }
        Outcome::Fatal(_) | Outcome::Unrecorded => 0,
    }
}

/// The seed of a layer's cases: `GOLDEN_SEED` (default 0) mixed with the layer's name, so that
/// layers of a suite do not all draw the same dims.
fn layer_seed(base: u64, layer: &Layer) -> u64 {
    base ^ inputs::fnv1a(layer.name.as_bytes())
}

/// `GOLDEN_SEED`, or 0 (an invalid value is reported when the check runs).
pub(crate) fn seed() -> u64 {
    env::seed().ok().flatten().unwrap_or(0)
}

/// The number of cases: `GOLDEN_CASES`, or what the check declares.
pub(crate) fn cases(_layer: &Layer, declared: u32) -> u32 {
    env::cases().ok().flatten().unwrap_or(declared)
}

/// The layer with the time budget its cases run within: `GOLDEN_BUDGET` over the declared
/// `budget` (`off`: none); an invalid value is reported when the check runs (`env::check_all`).
pub(crate) fn with_budget(layer: &Layer) -> std::borrow::Cow<'_, Layer> {
    match env::budget() {
        Ok(Some(over)) if over != layer.budget => {
            let mut layer = layer.clone();
            layer.budget = over;
            std::borrow::Cow::Owned(layer)
        }
        _ => std::borrow::Cow::Borrowed(layer),
    }
}

struct Settings {
    mode: env::Mode,
    seed: u64,
    /// `GOLDEN_SEED` was set: its own cases run, without the saved failing ones.
    explicit_seed: bool,
    cases: u32,
    overridden: bool,
    /// When the check began (a budget counts from there).
    started: Instant,
    /// `GOLDEN_CASE`: the one case to run, and in which dtypes.
    case: Option<(CaseParams, Vec<DType>)>,
    /// `GOLDEN_FAILURE_BUDGET`: elements, and the value as set.
    failure_budget: (u128, Option<String>),
}

fn settings(layer: &Layer, declared_cases: u32) -> Result<Settings, String> {
    let seed = env::seed()?;
    let cases = env::cases()?;
    if layer.timeout.is_none() {
        // The port's timeout as well as the reference's.
        env::timeout()?;
    }
    env::check_all()?;
    let case = env::case().map(|v| golden_case(&v, layer)).transpose()?;
    let failure_budget = env::failure_budget(DEFAULT_FAILURE_BUDGET)?;
    inputs::largest_case_fits(layer)?;
    Ok(Settings {
        mode: match layer.mode {
            Some(mode) => mode,
            None => env::mode()?,
        },
        seed: seed.unwrap_or(0),
        explicit_seed: seed.is_some(),
        cases: cases.unwrap_or(declared_cases),
        overridden: seed.is_some() || cases.is_some() || case.is_some() || env::budget()?.is_some(),
        started: Instant::now(),
        case,
        failure_budget,
    })
}

/// `GOLDEN_CASE` (`dims:style:seed[:dtype]`): the case, and the dtypes to run it in — the one it
/// names, which the check must test, else each of the check's.
fn golden_case(value: &str, layer: &Layer) -> Result<(CaseParams, Vec<DType>), String> {
    let value = value.trim();
    let params = CaseParams::parse(value, layer)?;
    let dtype = match value.rsplit_once(':') {
        Some((_, dtype)) if value.split(':').count() == 4 => Some(dtype.trim()),
        _ => None,
    };
    let Some(dtype) = dtype else {
        return Ok((params, layer.dtypes.clone()));
    };
    let checked: Vec<&str> = layer.dtypes.iter().map(|d| dtype_name(*d)).collect();
    if !["f32", "f64", "f16", "bf16"].contains(&dtype) {
        return Err(format!(
            "GOLDEN_CASE={value:?}: `{dtype}` is not a dtype (one of f32, f64, f16, bf16); \
             expected `dim=value,...:style:0xseed[:dtype]` as golden prints it"
        ));
    }
    match layer.dtypes.iter().find(|d| dtype_name(**d) == dtype) {
        Some(d) => Ok((params, vec![*d])),
        None => Err(format!(
            "GOLDEN_CASE={value:?} names the dtype {dtype}, which `{}` does not check: it checks \
             only {}; name one of those, or drop `:{dtype}` to run the case in each",
            layer.name,
            checked.join(", ")
        )),
    }
}

fn versions(info: &serde_json::Value) -> String {
    ["python", "numpy", "torch"]
        .iter()
        .filter_map(|k| info.get(*k)?.as_str().map(|v| format!("{k} {v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Open the source for a check of `kind`: the errors a user fixes once come out here.
pub(crate) fn open_source(
    layer: &Layer,
    kind: Kind,
    mode: env::Mode,
    description: &str,
) -> Result<(Source, String), Failure> {
    let config_error = |m: String| Failure::new(layer, FailureKind::Config(m));
    let target = Target {
        store_suffix: kind.suffix(),
        test: kind.test(),
        description,
    };
    let (source, info) = Source::open(layer, mode, &target).map_err(|e| match e {
        OpenError::Config(m) => config_error(m),
        OpenError::Setup(e, notes) => {
            let mut f = Failure::new(layer, FailureKind::Setup(e));
            f.notes = notes;
            f
        }
    })?;
    let how = match &source.via {
        Via::Live(_) => format!("live ({})", versions(&info)),
        Via::Record(..) => format!("live, recording ({})", versions(&info)),
        Via::Verify(_, store) => format!(
            "live, verifying {} ({})",
            store.path.display(),
            versions(&info)
        ),
        Via::Replay(store) => format!("replay ({})", store.path.display()),
    };
    // A checkpoint that does not fit the module fails before any case: no case changes it.
    source.prepare(layer).map_err(config_error)?;
    if mode == env::Mode::Auto && !source.is_replay() {
        eprintln!("golden: `{}`: {how}", layer.name);
    }
    if let Some(stale) = source.stale() {
        eprintln!("golden: `{}`: {stale}", layer.name);
    }
    Ok((source, how))
}

/// Write a recording source's store (the store records the reference, right or wrong port alike).
pub(crate) fn finish_source(
    layer: &Layer,
    kind: Kind,
    source: &Source,
    description: &str,
) -> Result<(), Failure> {
    let target = Target {
        store_suffix: kind.suffix(),
        test: kind.test(),
        description,
    };
    match source.finish(layer, &target) {
        Ok(Some(line)) => {
            eprintln!("{line}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(Failure::new(layer, FailureKind::Config(e))),
    }
}

/// Run a check of `kind` whose cases `runner` runs, and record its results.
pub(crate) fn run(
    layer: &Layer,
    kind: Kind,
    declared_cases: u32,
    description: &str,
    runner: &impl CaseRunner,
) -> Result<Report, Failure> {
    let started = Instant::now();
    let _quiet = PanicScope::enter();
    let result = run_inner(layer, kind, declared_cases, description, runner).map_err(|mut f| {
        f.check = kind;
        f
    });
    results::record(layer, kind, description, &result, started.elapsed());
    result
}

fn run_inner(
    layer: &Layer,
    kind: Kind,
    declared_cases: u32,
    description: &str,
    runner: &impl CaseRunner,
) -> Result<Report, Failure> {
    let config_error = |m: String| Failure::new(layer, FailureKind::Config(m));
    layer.validate().map_err(config_error)?;
    let settings = settings(layer, declared_cases).map_err(config_error)?;
    let (source, how) = open_source(layer, kind, settings.mode, description)?;
    let source = &source;
    if settings.case.is_none() {
        announce_saved(layer, kind, &settings);
    }
    // Record mode: every generated case goes into the store, even those after a failing one, up
    // to the store's size bound. The check then runs every declared case against the live
    // reference all the same, so that its snapshot (which describes them all) is compared and its
    // store lines name the partial store; only when the cases were changed (`GOLDEN_CASES`, ...:
    // no snapshot is compared) does it run the recorded ones alone.
    let mut recorded = vec![None; layer.dtypes.len()];
    if matches!(source.via, Via::Record(..)) {
        for (i, &dtype) in layer.dtypes.iter().enumerate() {
            recorded[i] = record_generated(layer, kind, dtype, runner, source, &settings)
                .map_err(config_error)?;
        }
    }
    let mut runs = Vec::new();
    let mut failure = None;
    if let Some((params, dtypes)) = &settings.case {
        match run_one_case(layer, runner, source, params, dtypes, &settings) {
            Ok(r) => runs = r,
            Err(f) => failure = Some(f),
        }
    } else {
        for (&dtype, &recorded) in layer.dtypes.iter().zip(&recorded) {
            match run_dtype(layer, kind, dtype, runner, source, &settings, recorded) {
                Ok(run) => runs.push(run),
                Err(f) => {
                    failure = Some(f);
                    break;
                }
            }
        }
    }
    finish_source(layer, kind, source, description)?;
    if failure.is_none() {
        failure = partial_store_unvouched(layer, kind, source);
    }
    if let Some(mut f) = failure {
        // Stale evidence is part of what a failure says; the snapshot does not change with it.
        if let Some(stale) = source.stale() {
            f.notes.insert(0, stale.to_string());
        }
        return Err(f);
    }
    let speed = time_passing(layer, kind, runner, source, &runs)?;
    Ok(Report {
        layer: layer.clone(),
        kind,
        description: description.to_string(),
        seed: settings.seed,
        cases: settings.cases,
        overridden: settings.overridden,
        source: how,
        runs,
        health: Vec::new(),
        store: crate::answers::store::path(layer, kind.suffix())
            .and_then(|p| crate::answers::store::stamp(&p)),
        recorded: matches!(source.via, Via::Record(..)),
        params: source.param_notes(layer),
        speed,
    })
}

/// Time the port beside the reference in each dtype whose cases passed (`GOLDEN_SPEED` runs
/// each side, `off`: none), and hold the port to `speed(max = N)`: a port its timed runs find
/// slower fails with a speed failure of its own. A case that cannot be timed says why on stderr
/// and fails nothing.
fn time_passing(
    layer: &Layer,
    kind: Kind,
    runner: &impl CaseRunner,
    source: &Source,
    runs: &[DTypeRun],
) -> Result<Vec<Speed>, Failure> {
    let timed_runs = env::speed_runs(crate::run::speed::RUNS)
        .map_err(|m| Failure::new(layer, FailureKind::Config(m)))?;
    let mut speeds = Vec::new();
    if timed_runs == 0 {
        return Ok(speeds);
    }
    for run in runs {
        let mut speed = match runner.speed(source, run.dtype, timed_runs) {
            None => continue,
            Some(Ok(speed)) => speed,
            Some(Err(why)) => {
                eprintln!(
                    "golden: `{}` was not timed in {}: {why}",
                    layer.name,
                    dtype_name(run.dtype)
                );
                continue;
            }
        };
        match layer.speed_max.map(|max| (max, speed.over(max))) {
            Some((max, Some(true))) => {
                let case = CaseParams::parse(&speed.case, layer).ok();
                let mut f = Failure::new(
                    layer,
                    FailureKind::Speed(Box::new(TooSlow {
                        speed,
                        max,
                        cases: run.cases.len() + run.replayed.len(),
                    })),
                );
                f.dtype = Some(dtype_name(run.dtype));
                if let Some(case) = &case {
                    f.notes.push(format!(
                        "re-run the check on this case: {}",
                        artifacts::rerun_case_command(layer, kind.test(), run.dtype, case)
                    ));
                }
                f.case = case;
                return Err(f);
            }
            Some((max, None)) => speed.notes.push(format!(
                "`speed(max = {})` was not judged: the reference was not timed",
                crate::describe::numbers::num(max)
            )),
            _ => {}
        }
        speeds.push(speed);
    }
    Ok(speeds)
}

/// Write the artifacts of a failed case and end the message with how to use them; the folder's
/// path is the last line. Before them, what the bound after a failure skipped (`after`).
pub(crate) fn leave_artifacts(
    layer: &Layer,
    kind: Kind,
    dtype: DType,
    failure: &mut Failure,
    after: &AfterFailure,
) {
    failure.notes.extend(after.note());
    let (FailureKind::Case(c), Some(case)) = (&failure.kind, &failure.case) else {
        return;
    };
    failure.notes.push(format!(
        "re-run exactly this case: {}",
        artifacts::rerun_case_command(layer, kind.test(), dtype, case)
    ));
    match artifacts::write(layer, kind, dtype, case, c) {
        Ok(dir) if kind == Kind::Forward => failure.notes.push(format!(
            "inputs, outputs and a repro.py that runs the reference again ({} repro.py) are in\n  {}",
            env::python().program.display(),
            dir.display()
        )),
        Ok(dir) if artifacts::has_repro(layer, kind) => failure.notes.push(format!(
            "inputs, cotangents, both sides' gradients and a repro.py that runs PyTorch's gradient \
             again ({} repro.py) are in\n  {}",
            env::python().program.display(),
            dir.display()
        )),
        Ok(dir) => failure.notes.push(format!(
            "the case's inputs and both sides' values (.npy) are in\n  {}",
            dir.display()
        )),
        Err(e) => failure
            .notes
            .push(format!("(could not write the failure's artifacts: {e})")),
    }
}

/// `GOLDEN_CASE`: run exactly one case in `dtypes`, no generation.
fn run_one_case(
    layer: &Layer,
    runner: &impl CaseRunner,
    source: &Source,
    params: &CaseParams,
    dtypes: &[DType],
    settings: &Settings,
) -> Result<Vec<DTypeRun>, Failure> {
    let mut runs = Vec::new();
    for &dtype in dtypes {
        let failure = |kind| {
            let mut f = Failure::new(layer, kind);
            f.dtype = Some(dtype_name(dtype));
            f.case = Some(params.clone());
            f
        };
        match run_caught(runner, source, dtype, params) {
            Outcome::Pass(record) => runs.push(DTypeRun {
                dtype,
                cases: vec![record],
                replayed: Vec::new(),
                skipped: 0,
                budgeted: None,
            }),
            Outcome::Fail(c) => {
                let after =
                    AfterFailure::new(settings.failure_budget.0, settings.failure_budget.1.clone());
                after.start(output_elements(&c.leaves));
                after.charge(1);
                let mut f = failure(FailureKind::Case(c));
                runner.finish(source, dtype, &mut f, Vec::new(), &after);
                return Err(f);
            }
            Outcome::Fatal(e) => return Err(failure(FailureKind::Worker(e))),
            Outcome::Unrecorded => {
                return Err(failure(FailureKind::Config(
                    "GOLDEN_CASE names a case the golden store has not recorded; run it live"
                        .into(),
                )));
            }
        }
    }
    Ok(runs)
}

/// The saved failing cases of a check of `kind` (`run/regressions.rs`): replayed first, unless
/// `GOLDEN_SEED` was set explicitly.
fn regressions(layer: &Layer, kind: Kind, settings: &Settings) -> Regressions {
    Regressions::new(
        format!("{}{}", layer.check_name(), kind.suffix()),
        layer.declared.map(|d| d.source_file),
        !settings.explicit_seed,
    )
}

/// Say, once per check, which saved failing cases run before the generated ones, or that an
/// explicit `GOLDEN_SEED` runs without them.
fn announce_saved(layer: &Layer, kind: Kind, settings: &Settings) {
    let regressions = regressions(layer, kind, settings);
    let saved = regressions.saved();
    let (n, Some(file)) = (saved.replayed(), regressions.file()) else {
        return;
    };
    if n == 0 {
        return;
    }
    let cases = |n: usize| format!("{n} saved failing case{}", if n == 1 { "" } else { "s" });
    if settings.explicit_seed {
        eprintln!(
            "golden: `{}`: GOLDEN_SEED is set: its own cases run, without the {} of {}",
            layer.name,
            cases(n),
            file.display()
        );
        return;
    }
    let untagged = if saved.untagged.is_empty() {
        String::new()
    } else {
        format!(
            " ({} on lines that name no check, which every check of the file replays: delete \
             them, or end each with `# {}{}: ...` to keep it to this check)",
            saved.untagged.len(),
            layer.check_name(),
            kind.suffix()
        )
    };
    eprintln!(
        "golden: `{}`: replays {} first, from {}{untagged}; then its {} generated cases \
         (GOLDEN_SEED=<n> runs other cases without them)",
        layer.name,
        cases(n),
        file.display(),
        settings.cases
    );
}

/// The proptest configuration of a check, what its regressions file holds for it, and the file,
/// which saves the failure proptest hands over only when told to ([`Regressions::keep`]).
fn runner_config(layer: &Layer, kind: Kind, settings: &Settings) -> (Config, Saved, Regressions) {
    let source_file = layer.declared.map(|d| d.source_file);
    let regressions = regressions(layer, kind, settings);
    let saved = if settings.explicit_seed {
        Saved::default()
    } else {
        regressions.saved()
    };
    let config = Config {
        cases: settings.cases,
        source_file,
        failure_persistence: Some(Box::new(regressions.clone())),
        rng_seed: RngSeed::Fixed(layer_seed(settings.seed, layer)),
        max_shrink_iters: 1024,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    (config, saved, regressions)
}

/// A time budget's clock over a dtype's generated cases (`budget = "60s"`): a case starts only if
/// the time the check has taken plus the mean time of the cases so far stays within the budget;
/// the first case always runs.
struct BudgetClock {
    budget: Option<std::time::Duration>,
    started: Instant,
    first: Cell<Option<Instant>>,
    ran: Cell<usize>,
    stopped: Cell<bool>,
}

impl BudgetClock {
    fn new(budget: Option<std::time::Duration>, started: Instant) -> Self {
        BudgetClock {
            budget,
            started,
            first: Cell::new(None),
            ran: Cell::new(0),
            stopped: Cell::new(false),
        }
    }

    /// Whether another case fits; counts it when it does.
    fn another(&self) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        if self.stopped.get() {
            return false;
        }
        if let Some(first) = self.first.get() {
            let mean = first.elapsed() / self.ran.get().max(1) as u32;
            if self.started.elapsed() + mean > budget {
                self.stopped.set(true);
                return false;
            }
        } else {
            self.first.set(Some(Instant::now()));
        }
        self.ran.set(self.ran.get() + 1);
        true
    }
}

/// Record mode, first pass: the reference on every case the check will generate, port unseen,
/// until the store's size bound (`GOLDEN_STORE_LIMIT`) is reached. Returns how many cases were
/// recorded when the bound stopped it and the check's cases were changed (`GOLDEN_CASES`, ...:
/// the check then runs those only), and says so.
fn record_generated(
    layer: &Layer,
    kind: Kind,
    dtype: DType,
    runner: &impl CaseRunner,
    source: &Source,
    settings: &Settings,
) -> Result<Option<usize>, String> {
    let limit = crate::answers::store::limit_bytes()?;
    // Its failures are never saved: the port does not run.
    let (config, saved, _) = runner_config(layer, kind, settings);
    let replays = saved.replayed();
    let mut proptest = TestRunner::new(config);
    let seen = Cell::new(0usize);
    let full: Cell<Option<usize>> = Cell::new(None);
    // A budget is timed afresh by a recording (its cases cost the reference alone here), and the
    // store keeps what it held.
    let clock = BudgetClock::new(layer.budget, settings.started);
    let strategy = inputs::case_strategy_for(layer, kind, replays);
    let _ = proptest.run(&strategy, |params| {
        if full.get().is_some() {
            // The store is full: the rest of the cases are neither evaluated nor checked.
            return Ok(());
        }
        if seen.get() >= replays && !clock.another() {
            return Ok(());
        }
        let result = match runner.reference_only(source, dtype, &params) {
            // A dead worker: stop here, the check itself will report it.
            Some(_) => Err(TestCaseError::fail("worker failure")),
            None => Ok(()),
        };
        if !source.recording_fits() {
            full.set(Some(seen.get()));
        }
        seen.set(seen.get() + 1);
        result
    });
    if let Some(budget) = layer.budget {
        let held = clock.ran.get();
        source.hold_budgeted(dtype, held);
        if clock.stopped.get() {
            eprintln!(
                "golden: `{}`: the {} budget held {held} of {} {} cases: recording stops there, \
                 and the golden store keeps that count for the runs after it",
                layer.name,
                crate::describe::numbers::budget(budget),
                settings.cases,
                dtype_name(dtype)
            );
        }
    }
    let Some(kept) = full.get() else {
        return Ok(None);
    };
    let bound = format!(
        "the golden store's size bound (GOLDEN_STORE_LIMIT, {})",
        crate::describe::numbers::bytes(limit as u128)
    );
    if kept == 0 {
        return Err(format!(
            "{bound} holds not even one {} case of this check{}; raise GOLDEN_STORE_LIMIT",
            dtype_name(dtype),
            if layer.dtypes.len() > 1 {
                " after the cases of the dtypes before it"
            } else {
                ""
            }
        ));
    }
    if settings.overridden {
        eprintln!(
            "golden: `{}`: {bound} is reached after {kept} of {} {} cases: recording stops there, \
             and the check runs those {kept} only (GOLDEN_SEED, GOLDEN_CASES or GOLDEN_CASE \
             changed the cases: no snapshot is compared)",
            layer.name,
            settings.cases,
            dtype_name(dtype)
        );
        return Ok(Some(kept));
    }
    eprintln!(
        "golden: `{}`: {bound} is reached after {kept} of {} {} cases: the store keeps those \
         {kept}; the check runs all {} against the live reference, so that its snapshot describes \
         them",
        layer.name,
        settings.cases,
        dtype_name(dtype),
        settings.cases
    );
    Ok(None)
}

/// Run a case, catching a panic that escapes the runner: it happened while the case ran (in code
/// the port's graph runs outside its own calls, or in golden's), and fails that case like a
/// panicking port, with its message.
/// A checkpoint that changed on disk while the case ran stops the check: whatever the case found
/// was found on bytes golden did not hash.
fn run_caught(
    runner: &impl CaseRunner,
    source: &Source,
    dtype: DType,
    params: &CaseParams,
) -> Outcome {
    let outcome = catching(|| runner.run(source, dtype, params)).unwrap_or_else(|message| {
        Outcome::Fail(Box::new(CaseFailure {
            port: Some(PortFault::Panicked(format!(
                "{message} (while golden ran the case, outside the port's own calls: the \
                 backtrace printed with RUST_BACKTRACE=1 shows where)"
            ))),
            ..CaseFailure::default()
        }))
    });
    match outcome {
        fatal @ Outcome::Fatal(_) => fatal,
        other => source.checkpoint_changed().map_or(other, Outcome::Fatal),
    }
}

/// Up to `wanted` failing cases other than `smallest`, run again: the first failing case when
/// shrinking went below it; then fresh cases drawn as the check draws them (a shrunk case is often
/// too small to show a mistake's shape: one position, one element); then the cases shrinking saw
/// fail. A few tries at most, within `after`'s bound; in replay only recorded cases count.
#[allow(clippy::too_many_arguments)]
fn other_failures(
    layer: &Layer,
    kind: Kind,
    runner: &impl CaseRunner,
    source: &Source,
    dtype: DType,
    smallest: &CaseParams,
    first: &CaseParams,
    failing: &[CaseParams],
    after: &AfterFailure,
) -> Vec<(CaseParams, Box<CaseFailure>)> {
    use proptest::strategy::{Strategy, ValueTree};
    let wanted = runner.others_wanted();
    let strategy = inputs::case_strategy_for(layer, kind, 0);
    let mut draws = TestRunner::deterministic();
    let fresh = (0..4).filter_map(|_| Some(strategy.new_tree(&mut draws).ok()?.current()));
    let candidates = std::iter::once(first.clone())
        .chain(fresh)
        .chain(failing.iter().cloned());
    let mut tried = Vec::new();
    let mut found = Vec::new();
    for params in candidates {
        if found.len() >= wanted || tried.len() >= 2 * wanted + 3 {
            break;
        }
        if &params == smallest || tried.contains(&params) {
            continue;
        }
        // A case and its diagnosis, within the bound after a failure.
        if !after.take(
            2,
            0,
            "another failing case (a likely cause is told when it holds on two)",
        ) {
            break;
        }
        tried.push(params.clone());
        if let Outcome::Fail(c) = run_caught(runner, source, dtype, &params) {
            found.push((params, c));
        }
    }
    found
}

/// A traced failure stops shrinking once this many failing cases in a row (the first and the
/// smaller ones shrinking found) diverge first at the same trace point: what the trace tells is
/// settled, and at a whole model's size every further candidate costs a whole-model evaluation.
const STABLE_DIVERGENCE: usize = 3;

/// Generate, run and shrink one dtype's cases. `recorded`: record mode stopped recording at the
/// store's bound after that many cases; the others are skipped.
fn run_dtype(
    layer: &Layer,
    kind: Kind,
    dtype: DType,
    runner: &impl CaseRunner,
    source: &Source,
    settings: &Settings,
    recorded: Option<usize>,
) -> Result<DTypeRun, Failure> {
    let (mut config, saved, persistence) = runner_config(layer, kind, settings);
    let replays = saved.replayed();
    let partial = matches!(&source.via, Via::Replay(store) | Via::Verify(_, store) if store.partial.is_some());
    // A budget's count, when the golden store (or this recording) fixed it: exactly those cases;
    // otherwise timed as the cases go.
    let pinned = layer
        .budget
        .and_then(|_| source.budgeted_cases(dtype))
        .filter(|_| settings.case.is_none() && !settings.overridden);
    if let Some(n) = pinned {
        config.cases = n as u32;
    }
    let clock = BudgetClock::new(layer.budget.filter(|_| pinned.is_none()), settings.started);
    let generated = Cell::new(0usize);
    let mut proptest = TestRunner::new(config);
    let records = RefCell::new(Vec::new());
    // The first failing case, how many passed before it, and whether it was a saved one.
    let first_failure: RefCell<Option<(CaseParams, usize, bool)>> = RefCell::new(None);
    // Every failing case seen while shrinking, in order: another failing case than the smallest
    // one when the first is the smallest.
    let failing: RefCell<Vec<CaseParams>> = RefCell::new(Vec::new());
    let fatal: RefCell<Option<(CaseParams, FailureKind)>> = RefCell::new(None);
    let shrink_steps = Cell::new(0u32);
    let skipped = Cell::new(0usize);
    let unrecorded_shrinks = Cell::new(0u32);
    // A traced failure's first divergence over the failing cases in a row, and the point where
    // shrinking stopped because it held still (see `STABLE_DIVERGENCE`).
    let divergences: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let stable: RefCell<Option<String>> = RefCell::new(None);
    // What may be evaluated after the first failure (`AfterFailure`): the most recent case's
    // elements (what the next smaller one costs at most), whether the bound cut shrinking, and
    // the first failure itself when the bound leaves no smaller case to try (it is then the
    // smallest: kept, not evaluated again).
    let after = AfterFailure::new(settings.failure_budget.0, settings.failure_budget.1.clone());
    let last_elements = Cell::new(0u128);
    let shrink_cut = Cell::new(false);
    let kept: RefCell<Option<Box<CaseFailure>>> = RefCell::new(None);

    let strategy = inputs::case_strategy_for(layer, kind, replays);
    let result = proptest.run(&strategy, |params| {
        if fatal.borrow().is_some() {
            // The worker died (or the store is stale): stop exercising it, let proptest wind down.
            return Err(TestCaseError::fail("aborted"));
        }
        let shrinking = first_failure.borrow().is_some();
        if shrinking && stable.borrow().is_some() {
            // The first divergence held still: no more candidates are evaluated (each is a
            // whole model's at size); proptest winds down and keeps the last failing case.
            return Ok(());
        }
        if shrinking && (shrink_cut.get() || !after.fits_elements(last_elements.get(), 2)) {
            // The bound after a failure: no more smaller cases (two cases are kept for the
            // smallest failure and its diagnosis); proptest keeps the last failing case.
            shrink_cut.set(true);
            return Ok(());
        }
        if shrinking {
            shrink_steps.set(shrink_steps.get() + 1);
        } else {
            generated.set(generated.get() + 1);
            if recorded.is_some_and(|n| generated.get() > n) {
                skipped.set(skipped.get() + 1);
                return Ok(());
            }
            // Past the saved failing cases, a budget decides whether another case runs.
            if generated.get() > replays && !clock.another() {
                return Ok(());
            }
        }
        let outcome = run_caught(runner, source, dtype, &params);
        last_elements.set(outcome_elements(&outcome));
        if shrinking {
            after.charge_elements(last_elements.get());
        }
        match outcome {
            Outcome::Pass(record) => {
                records.borrow_mut().push(record);
                Ok(())
            }
            // A reference that is not deterministic cannot be shrunk against: stop here.
            Outcome::Fail(f) if f.reference_is_nondeterministic() => {
                *fatal.borrow_mut() = Some((params, FailureKind::Case(f)));
                Err(TestCaseError::fail("the reference is not deterministic"))
            }
            // A reference that cannot be driven through a schedule (no cache, too few positions)
            // cannot on any case: a configuration error, not shrunk.
            Outcome::Fail(f) if f.reference_cannot_follow_schedule() => {
                let message = f
                    .reference_error
                    .as_ref()
                    .map_or_else(String::new, |e| e.to_string());
                *fatal.borrow_mut() = Some((
                    params,
                    FailureKind::Config(format!(
                        "the reference cannot be driven through `decode`'s schedules: {message}"
                    )),
                ));
                Err(TestCaseError::fail(
                    "the reference cannot follow the schedule",
                ))
            }
            // Outputs of another structure than the reference's (a leaf one side returns and the
            // other does not) are so on every case: said on the first, not shrunk.
            Outcome::Fail(f) if f.outputs_differ_in_structure() => {
                *fatal.borrow_mut() = Some((params, FailureKind::Case(f)));
                Err(TestCaseError::fail("the outputs differ in structure"))
            }
            // A port that did not return is not shrunk: each try would wait the whole timeout.
            Outcome::Fail(f) if matches!(f.port, Some(PortFault::TimedOut(_))) => {
                *fatal.borrow_mut() = Some((params, FailureKind::Case(f)));
                Err(TestCaseError::fail("the port did not return"))
            }
            Outcome::Fail(f) => {
                let first = first_failure.borrow().is_none();
                first_failure.borrow_mut().get_or_insert_with(|| {
                    (
                        params.clone(),
                        records.borrow().len(),
                        generated.get() <= replays,
                    )
                });
                failing.borrow_mut().push(params.clone());
                if first {
                    after.start(output_elements(&f.leaves));
                    if !after.fits_elements(last_elements.get(), 2) {
                        // No smaller case will be tried: this failure is the smallest.
                        let headline = f.headline();
                        *kept.borrow_mut() = Some(f);
                        return Err(TestCaseError::fail(headline));
                    }
                }
                if let Some((_, point)) = crate::judge::trace::first_divergence(&f.leaves) {
                    let mut seen = divergences.borrow_mut();
                    if seen.last() != Some(&point.name) {
                        seen.clear();
                    }
                    seen.push(point.name.clone());
                    if seen.len() >= STABLE_DIVERGENCE {
                        *stable.borrow_mut() = Some(point.name.clone());
                    }
                }
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
                let path = match &source.via {
                    Via::Replay(store) | Via::Verify(_, store) => store.path.display().to_string(),
                    _ => unreachable!("only a replay or a verification leaves cases unrecorded"),
                };
                let msg = format!(
                    "the golden store {path} has no outputs for a case this check generates \
                     ({params}): it is out of date; record it again (needs Python with torch): {}",
                    layer.rerun_command(kind.test(), "GOLDEN_MODE=record")
                );
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
            // A comparison that compared nothing never reports a match.
            if let Some(why) = compared_nothing(layer, kind, dtype, &cases) {
                let mut f = Failure::new(layer, FailureKind::Config(why));
                f.dtype = Some(dtype_name(dtype));
                return Err(f);
            }
            let replayed = cases.drain(..replays.min(cases.len())).collect();
            let budgeted = layer.budget.map(|budget| {
                let held = pinned.unwrap_or(clock.ran.get());
                source.hold_budgeted(dtype, held);
                (held, settings.cases, budget)
            });
            Ok(DTypeRun {
                dtype,
                cases,
                replayed,
                skipped: skipped.get(),
                budgeted,
            })
        }
        Err(TestError::Fail(reason, minimal)) => {
            if let Some((case, kind)) = fatal.into_inner() {
                let stuck = matches!(kind, FailureKind::Case(_));
                let mut f = failure(kind, case);
                if stuck {
                    f.passed_before = records.borrow().len() as u32;
                    runner.finish(source, dtype, &mut f, Vec::new(), &after);
                }
                return Err(f);
            }
            let Some((first, passed_before, saved_case)) = first_failure.into_inner() else {
                // Every failing case is recorded above; a failure proptest saw that no case
                // recorded is proptest's own.
                return Err(failure(
                    FailureKind::Config(format!(
                        "proptest reported a failure that no case recorded: {reason}"
                    )),
                    minimal,
                ));
            };
            if shrink_cut.get() {
                after.skip(&match shrink_steps.get() {
                    0 => "shrinking (no smaller case tried)".to_string(),
                    n => format!("shrinking (stopped after {n} smaller cases)"),
                });
            }
            // The smallest failure: kept when no smaller case was tried, else evaluated again.
            let reuse = kept.into_inner().filter(|_| minimal == first);
            let again = match reuse {
                Some(c) => Outcome::Fail(c),
                None => {
                    let outcome = run_caught(runner, source, dtype, &minimal);
                    after.charge_elements(outcome_elements(&outcome));
                    outcome
                }
            };
            // Its diagnosis takes about one case more.
            after.charge(1);
            // Whether the smallest case failed again: only then is the failure its case's.
            let mut reproduced = false;
            let mut f = match again {
                Outcome::Fail(c) => {
                    reproduced = true;
                    failure(FailureKind::Case(c), minimal.clone())
                }
                Outcome::Fatal(e) => failure(FailureKind::Worker(e), minimal.clone()),
                Outcome::Pass(_) | Outcome::Unrecorded => {
                    // Not reproducible: show the first failure as it happened.
                    let mut f = match run_caught(runner, source, dtype, &first) {
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
            if let Some(point) = stable.into_inner() {
                f.notes.push(format!(
                    "note: shrinking stopped once the first divergence held still: `{}` on {} \
                     failing cases in a row",
                    point.trim_start_matches(crate::judge::trace::PREFIX),
                    STABLE_DIVERGENCE
                ));
            }
            // Shrinking keeps the failure but can erase its evidence (a bias is invisible with a
            // batch of one), and a cause is only told when it holds on two failing cases: the
            // runner gets another failing case too.
            let others = match (&f.kind, f.case.clone()) {
                (FailureKind::Case(_), Some(smallest)) => other_failures(
                    layer,
                    kind,
                    runner,
                    source,
                    dtype,
                    &smallest,
                    &first,
                    &failing.borrow(),
                    &after,
                ),
                _ => Vec::new(),
            };
            runner.finish(source, dtype, &mut f, others, &after);
            if saved_case {
                f.notes.push(format!(
                    "note: the first failing case was saved by an earlier failure of this check \
                     (in {}) and replayed before the generated cases; `GOLDEN_SEED=<n>` runs \
                     other cases without it",
                    regressions(layer, kind, settings)
                        .file()
                        .map_or("proptest's regressions file".into(), |f| f
                            .display()
                            .to_string())
                ));
            }
            // The seed proptest handed over is saved for replay only for the port's own failure.
            if crate::run::regressions::persistable(&f, reproduced) {
                persistence.keep();
            }
            f.shrunk_from = Some((first, shrink_steps.get()));
            f.passed_before = passed_before as u32;
            f.passed_configurations = crate::describe::sweep::covered(
                records.borrow()[..passed_before]
                    .iter()
                    .map(|r| r.params.config.as_slice()),
            );
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

/// Why a dtype's run proves nothing, when it does not: no case ran; every case compared no element
/// (every output leaf empty); or a leaf with elements compared none of them in any case — none
/// finite on both sides (NaN matched NaN, the same ±Inf on both sides, or left out where the
/// reference's own result is unreliable), so a port off by any factor there would pass it too.
/// `None` when every leaf that has elements compared some.
fn compared_nothing(
    layer: &Layer,
    kind: Kind,
    dtype: DType,
    cases: &[CaseRecord],
) -> Option<String> {
    if kind == Kind::Overfit {
        return None;
    }
    use crate::judge::compare::Verdict;
    // Per leaf, over the cases: elements, compared, NaN/±Inf agreed on both sides, left out; and
    // the first case in which it had elements.
    struct Tally<'a> {
        name: &'a str,
        numel: usize,
        compared: usize,
        agreed: usize,
        unreliable: usize,
        nan: usize,
        first: Option<&'a CaseParams>,
    }
    let mut leaves: Vec<Tally<'_>> = Vec::new();
    for case in cases {
        for leaf in &case.leaves {
            let Verdict::Values(v) = &leaf.verdict else {
                continue;
            };
            let i = match leaves.iter().position(|t| t.name == leaf.name) {
                Some(i) => i,
                None => {
                    leaves.push(Tally {
                        name: &leaf.name,
                        numel: 0,
                        compared: 0,
                        agreed: 0,
                        unreliable: 0,
                        nan: 0,
                        first: None,
                    });
                    leaves.len() - 1
                }
            };
            let t = &mut leaves[i];
            t.numel += v.numel;
            t.compared += v.compared;
            t.agreed += v.nonfinite_agreed;
            t.unreliable += v.unreliable;
            t.nan += v.nan.1;
            if v.numel > 0 {
                t.first.get_or_insert(&case.params);
            }
        }
    }
    // A gradient check's finite-difference figures compare too (a NaN one compares nothing).
    let figures = cases
        .iter()
        .flat_map(|c| &c.figures)
        .any(|(_, v)| v.is_finite());
    if cases.is_empty() {
        return Some(format!(
            "`{}` ran no {} case: a check that compared nothing never passes",
            layer.name,
            dtype_name(dtype)
        ));
    }
    if leaves.iter().all(|t| t.numel == 0) {
        if figures && kind == Kind::Gradients {
            return None;
        }
        return Some(format!(
            "`{}` compared no element in its {} {} cases: every output leaf was empty (0 \
             elements), so no port could fail it; give the dims that size the outputs a range \
             that reaches 1",
            layer.name,
            cases.len(),
            dtype_name(dtype)
        ));
    }
    // Where a gradient check's leaf is only left out (unreliable, not NaN), its finite
    // differences still judged the port's gradient.
    let differenced = figures && kind == Kind::Gradients;
    let nothing: Vec<String> = leaves
        .iter()
        .filter(|t| t.numel > 0 && t.compared == 0 && !(differenced && t.agreed == 0))
        .map(|t| {
            let how = if t.agreed == t.numel && t.nan == t.numel {
                format!("NaN on both sides at every one of its {} elements", t.numel)
            } else {
                format!(
                    "of its {} elements, {} NaN or the same ±Inf on both sides and {} left out \
                     where the reference's own result is unreliable",
                    t.numel, t.agreed, t.unreliable
                )
            };
            let first = t
                .first
                .map_or(String::new(), |c| format!(", the first case {c}"));
            format!(
                "it compared nothing at leaf `{}`: no element of it is finite on both sides in \
                 any of its {} {} cases ({how}{first}), and NaN matches NaN: a port off by any \
                 factor there gives the same",
                t.name,
                cases.len(),
                dtype_name(dtype)
            )
        })
        .collect();
    if nothing.is_empty() {
        return None;
    }
    let cause = if layer.form == crate::describe::layer::Form::Module {
        "the reference's own outputs are not finite there on any case: a NaN or ±Inf among the \
         parameters the reference runs with (a checkpoint's, `weights = ...`), in its inputs or \
         constants, or an overflow on every input"
    } else {
        "the reference's own outputs are not finite there on any case: a NaN or ±Inf in its \
         inputs or constants, or an overflow on every input"
    };
    Some(format!(
        "{}; {cause}. Give the reference values under which it computes a finite result (a \
         checkpoint without NaN, a distribution it is defined on), or leave the leaf out of its \
         outputs",
        nothing.join("; ")
    ))
}

/// A replay of a partial store does not compare the snapshot (which describes every case), and
/// with it went the SHA-256 line that makes a store tamper-evident. So the store's digest is
/// checked against the committed snapshot's here, whatever the store's header says: a store that
/// changed without its snapshot fails, and in CI (where a missing snapshot fails anyway) so does
/// one without a snapshot to vouch for it.
fn partial_store_unvouched(layer: &Layer, kind: Kind, source: &Source) -> Option<Failure> {
    let Via::Replay(store) = &source.via else {
        return None;
    };
    store.partial?;
    let fail = |why: String| Some(Failure::new(layer, FailureKind::Config(why)));
    let digest = crate::answers::store::digest(&store.path)?;
    let name = format!("{}{}", layer.check_name(), kind.suffix());
    let live = layer.rerun_command(kind.test(), "GOLDEN_MODE=live");
    match crate::report::snapshot::committed_store_digest(layer, &name) {
        Ok(Some(recorded)) if recorded == digest => None,
        Ok(recorded) => fail(format!(
            "the golden store {} holds only some of the cases (its size bound), so its snapshot \
             is not compared in replay; but its snapshot records another store ({}) than this \
             one (sha256 {digest}): the store changed without its snapshot. If you recorded it, \
             run the check live once and review the snapshot's change ({live}, then cargo insta \
             review); otherwise restore the store from version control",
            store.path.display(),
            recorded.map_or("no store at all".to_string(), |d| format!("sha256 {d}"))
        )),
        Err(snapshot) if crate::report::snapshot::ci() => fail(format!(
            "the golden store {} holds only some of the cases, so its snapshot is not compared \
             in replay, and there is no snapshot ({}) to check the store's SHA-256 against: \
             a partial store is trusted only beside the snapshot that records it; run the check \
             live once ({live}) and commit its snapshot",
            store.path.display(),
            snapshot.display()
        )),
        Err(snapshot) => {
            eprintln!(
                "golden: `{}`: the golden store {} holds only some of the cases and there is no \
                 snapshot ({}) to check its SHA-256 against; in CI this fails: run the check \
                 live once ({live}) and commit its snapshot",
                layer.name,
                store.path.display(),
                snapshot.display()
            );
            None
        }
    }
}
