//! What a failing check says: the layer, the case, every failing leaf with its numbers, and the fix
//! where golden knows it.

use crate::answers::live::ReferenceOutputs;
use crate::answers::params::ParamIssue;
use crate::describe::inputs::CaseParams;
use crate::describe::numbers::num;
use crate::judge::compare::{Leaf, Verdict};
use crate::judge::diagnose::Diagnosis;
use crate::judge::mutations::MutationMatch;
use crate::python::worker::{RemoteKind, WorkerError};
use crate::report::issues::{GradientIssue, ScheduleIssue, TrainingIssue};
use golden_files::HostTensor;
use std::fmt::{self, Write as _};

/// Why a check failed.
#[derive(Debug)]
pub enum FailureKind {
    /// The layer description or the environment is invalid.
    Config(String),
    /// The reference could not be reached before any case ran: interpreter, imports, the callable.
    Setup(WorkerError),
    /// A case failed.
    Case(Box<CaseFailure>),
    /// The worker died, hung or broke the protocol during a case (not shrunk: each retry would
    /// restart Python).
    Worker(WorkerError),
}

/// What went wrong with the port on a case, when it did not return outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortFault {
    /// It returned an error (the error's message).
    Errored(String),
    /// It panicked (the panic's message).
    Panicked(String),
    /// It did not return within the timeout (on which case, and what to do).
    TimedOut(String),
}

impl PortFault {
    /// The message, whatever happened.
    pub fn message(&self) -> &str {
        match self {
            PortFault::Errored(m) | PortFault::Panicked(m) | PortFault::TimedOut(m) => m,
        }
    }

    /// The message, to add to it (the step a schedule was at).
    pub fn message_mut(&mut self) -> &mut String {
        match self {
            PortFault::Errored(m) | PortFault::Panicked(m) | PortFault::TimedOut(m) => m,
        }
    }
}

impl fmt::Display for PortFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortFault::TimedOut(m) => write!(f, "the port {m}"),
            PortFault::Panicked(m) => write!(f, "the port panicked: {m}"),
            PortFault::Errored(m) => write!(f, "the port returned an error: {m}"),
        }
    }
}

/// Everything that went wrong in one case.
#[derive(Debug, Default)]
pub struct CaseFailure {
    /// Module form: names, shapes and unused entries between port and state_dict.
    pub params: Vec<ParamIssue>,
    /// What went wrong with the port itself (None: it returned outputs).
    pub port: Option<PortFault>,
    /// The reference raised or returned something that is not a tensor.
    pub reference_error: Option<WorkerError>,
    /// Leaf comparisons (all leaves; only failing ones are printed).
    pub leaves: Vec<Leaf>,
    /// Why no float64 evaluation was available (the default tolerance then has no rounding term).
    pub precise_error: Option<String>,
    /// Inputs could not be generated.
    pub inputs_error: Option<String>,
    /// The case's inputs, by argument name.
    pub inputs: Vec<(String, HostTensor)>,
    /// What the reference produced (None if it failed).
    pub reference: Option<ReferenceOutputs>,
    /// What the port produced, leaf by leaf.
    pub port_outputs: Vec<(String, HostTensor)>,
    /// Likely causes that fit the numbers (see `diagnose.rs`).
    pub diagnoses: Vec<LeafDiagnosis>,
    /// How many other failing cases the diagnoses were tested on (a hypothesis is a cause when it
    /// holds on two).
    pub other_cases: usize,
    /// Known variants of the reference that the port matches (`golden_ref.variants`).
    pub variants: Vec<VariantMatch>,
    /// Mutants of the reference (one torch call turned into a common porting mistake) that the
    /// port matches, best fit first (`judge::mutations`).
    pub mutations: Vec<MutationMatch>,
    /// The gradient check: what is wrong with the port's gradients beyond their values (missing
    /// or extra gradients, finite differences, zero cotangent, determinism).
    pub gradient_issues: Vec<GradientIssue>,
    /// The gradient check: the cotangent of each float output leaf (`L = Σ sum(out ·
    /// cotangent)`), left in the failure's artifacts for its repro.py.
    pub cotangents: Vec<(String, HostTensor)>,
    /// The overfit check: what went wrong in training (no overfit, a parameter never updated, a
    /// step where the port's training parts from PyTorch's) and the gradient-health flags.
    pub training_issues: Vec<TrainingIssue>,
    /// A check with a schedule: what the port does wrong beyond its steps' values (padding that
    /// leaks into valid outputs, a free-running generation that parts from the reference's).
    pub schedule_issues: Vec<ScheduleIssue>,
    /// The overfit check: its figures (losses, parity with PyTorch), as a passing training
    /// records them, for the results file.
    pub figures: Vec<(String, f64)>,
    /// Trace points of the reference the port did not tap (`trace.<name>`, execution order).
    pub untapped: Vec<String>,
    /// Taps of the port that name no trace point of the reference, each with what it could name
    /// instead (`judge::trace::unknown_tap`). They fail the case, but are no divergence.
    pub unknown_taps: Vec<String>,
    /// Declared invariants of the outputs the port breaks (`judge/invariants.rs`): a failure of
    /// their own, whatever the comparison says.
    pub invariants: Vec<crate::judge::invariants::Violation>,
    /// What the case showed that does not fail it on its own (see `report::passed::Note`).
    pub notes: Vec<crate::report::passed::Note>,
}

/// A known variant of the reference that the port matches.
#[derive(Clone, Debug, PartialEq)]
pub struct VariantMatch {
    /// The variant's name.
    pub name: String,
    /// How to fix the port.
    pub fix: String,
    /// The port's greatest difference to it.
    pub max_diff: f64,
}

/// A likely cause found on one leaf.
#[derive(Clone, Debug, PartialEq)]
pub struct LeafDiagnosis {
    /// The leaf.
    pub leaf: String,
    /// The evidence and the cause.
    pub diagnosis: Diagnosis,
    /// Set when it showed on another failing case rather than on the smallest one.
    pub on_first_case: Option<CaseParams>,
    /// Whether it may be told as a cause: an observation, or a hypothesis that held on two
    /// failing cases. Otherwise it is evidence from one case, told as such.
    pub confirmed: bool,
}

impl CaseFailure {
    /// Whether the reference answered differently twice on this case's inputs.
    pub fn reference_is_nondeterministic(&self) -> bool {
        remote_kind(self.reference_error.as_ref()) == Some(&RemoteKind::Nondeterministic)
    }

    /// Whether the reference cannot be driven through the case's schedule at all (no cache to
    /// carry, more positions than it has): no case can run.
    pub fn reference_cannot_follow_schedule(&self) -> bool {
        remote_kind(self.reference_error.as_ref()) == Some(&RemoteKind::Schedule)
    }

    /// Whether the port returns other output leaves than the reference (a leaf one side has and
    /// the other has not): no case changes that, so it is not shrunk, nor diagnosed.
    pub fn outputs_differ_in_structure(&self) -> bool {
        crate::report::structure::mismatch(&self.leaves).is_some()
    }

    /// One line for proptest's own bookkeeping.
    pub fn headline(&self) -> String {
        if let Some(p) = self.params.first() {
            return p.to_string();
        }
        if let Some(e) = &self.port {
            return format!("port error: {}", e.message());
        }
        if let Some(e) = &self.reference_error {
            return format!("reference error: {e}");
        }
        if let Some(e) = &self.inputs_error {
            return e.clone();
        }
        if let Some(g) = self.gradient_issues.first() {
            return g.to_string();
        }
        if let Some(t) = self.training_issues.first() {
            return t.to_string();
        }
        if let Some(t) = self.schedule_issues.first() {
            return t.to_string();
        }
        if let Some(t) = self.unknown_taps.first() {
            return t.clone();
        }
        if let Some(v) = self.invariants.first() {
            return format!("invariant: {v}");
        }
        let failing: Vec<&str> = self
            .leaves
            .iter()
            .filter(|l| !l.passes())
            .map(|l| l.name.as_str())
            .collect();
        format!("mismatch in {}", failing.join(", "))
    }
}

/// A failed check.
#[derive(Debug)]
pub struct Failure {
    /// The Rust function.
    pub layer: String,
    /// The reference's dotted path.
    pub reference: String,
    /// The dtype being checked, once cases ran.
    pub dtype: Option<&'static str>,
    /// The (minimal) failing case.
    pub case: Option<CaseParams>,
    /// The case first found to fail, when shrinking found a smaller one.
    pub shrunk_from: Option<(CaseParams, u32)>,
    /// How many cases passed before the failure.
    pub passed_before: u32,
    /// A check with swept values: the configurations of the cases that passed before the
    /// failure, each with how many (`softcap=None`, 9): which branches the port gets right.
    pub passed_configurations: Vec<(String, usize)>,
    /// What went wrong.
    pub kind: FailureKind,
    /// Extra lines at the end (where artifacts are, how to re-run).
    pub notes: Vec<String>,
    /// Which check failed.
    pub check: crate::describe::checks::Kind,
}

impl Failure {
    pub(crate) fn new(layer: &crate::describe::layer::Layer, kind: FailureKind) -> Self {
        Failure {
            layer: layer.name.clone(),
            reference: layer.reference.clone(),
            dtype: None,
            case: None,
            shrunk_from: None,
            passed_before: 0,
            passed_configurations: Vec::new(),
            kind,
            notes: Vec::new(),
            check: crate::describe::checks::Kind::Forward,
        }
    }

    /// A schedule's failing case: its steps and the first step at which a leaf fails.
    fn first_failing_step<'a>(
        &'a self,
        c: &CaseFailure,
    ) -> Option<(&'a crate::describe::schedule::Steps, usize)> {
        let steps = self.case.as_ref()?.steps.as_ref()?;
        let (k, _) = crate::judge::trace::first_failing_step(&c.leaves)?;
        Some((steps, k))
    }

    /// The case failure, if a case failed on values or errors.
    pub fn case_failure(&self) -> Option<&CaseFailure> {
        match &self.kind {
            FailureKind::Case(c) => Some(c),
            _ => None,
        }
    }

    /// The likely cause in one line, when the failure tells one (for summaries such as
    /// `golden report --markdown`): the reference's operation the port matches once changed, on
    /// both failing cases; else the first cause the numbers confirm on two failing cases; else a
    /// known variant of the reference the port matches; else a cause the gradient or training
    /// check names. Failing those, evidence from one failing case (a replay that had no
    /// second recorded case to confirm it on), said to be only that.
    pub fn likely_cause(&self) -> Option<String> {
        let c = self.case_failure()?;
        let matched = MutationMatch::claim;
        if let Some(m) = c.mutations.iter().find(|m| m.both_cases) {
            return Some(format!("{} — fix: {}", matched(m), m.fix));
        }
        if let Some(d) = c.diagnoses.iter().find(|d| d.confirmed) {
            return Some(format!("`{}`: {}", d.leaf, d.diagnosis));
        }
        if let Some(v) = c.variants.first() {
            return Some(format!(
                "the port matches `{}`, a known variant of the reference: {}",
                v.name, v.fix
            ));
        }
        let named = c
            .gradient_issues
            .iter()
            .find_map(GradientIssue::likely_cause)
            .or_else(|| {
                c.training_issues
                    .iter()
                    .find_map(TrainingIssue::likely_cause)
            });
        if let Some(cause) = named {
            return Some(cause.to_string());
        }
        if let Some(m) = c.mutations.first() {
            return Some(format!(
                "evidence from one failing case only: {}, which would mean: {}",
                matched(m),
                m.fix
            ));
        }
        c.diagnoses.first().map(|d| {
            format!(
                "evidence from one failing case only: `{}`: {}",
                d.leaf, d.diagnosis.evidence
            )
        })
    }
}

/// The module Python says is missing (`No module named 'transformers'`), top-level package first.
fn missing_module(message: &str) -> Option<&str> {
    let rest = message.split("No module named '").nth(1)?;
    let name = &rest[..rest.find('\'')?];
    Some(name.split('.').next().unwrap_or(name)).filter(|n| !n.is_empty())
}

/// The distribution pip installs for an importable name, where the two differ.
fn pip_name(module: &str) -> &str {
    match module {
        "yaml" => "pyyaml",
        "sklearn" => "scikit-learn",
        "PIL" => "pillow",
        "cv2" => "opencv-python",
        "bs4" => "beautifulsoup4",
        "google" => "protobuf",
        "attr" => "attrs",
        other => other,
    }
}

/// How to add `module` to the interpreter golden runs: `golden setup` with the crate's
/// requirements, or pip in that very interpreter.
fn install_fix(module: &str) -> String {
    let python = crate::describe::env::python();
    let program = python.program.display().to_string();
    let package = pip_name(module);
    format!(
        "fix: the interpreter golden used, `{program}` (chosen from {}), has no module \
         `{module}`. Add `{package}` to reference_py/requirements.txt beside your Cargo.toml and \
         run `golden setup`, or install it into that interpreter: {program} -m pip install \
         {package}",
        python.source
    )
}

fn remote_fix(e: &WorkerError, reference: &str) -> Option<String> {
    let WorkerError::Remote(r) = e else {
        return None;
    };
    if let Some(module) = missing_module(&r.message) {
        return Some(install_fix(module));
    }
    Some(match &r.kind {
        RemoteKind::Import if r.message.starts_with("no module named `") => {
            let python = crate::describe::env::python();
            let top = reference.split('.').next().unwrap_or(reference);
            format!(
                "fix: if `{top}` is your code, put its folder in `reference_py/` beside \
                 Cargo.toml (or in GOLDEN_REFERENCE_PATH); if it is a package from PyPI, add it \
                 to reference_py/requirements.txt and run `golden setup`, or install it into \
                 the interpreter golden used: {} -m pip install {}",
                python.program.display(),
                pip_name(top)
            )
        }
        RemoteKind::Import => format!(
            "fix: make `{reference}` importable: its module must be on an import root \
             (GOLDEN_REFERENCE_PATH, or `reference_py/` beside Cargo.toml) and import cleanly in \
             the interpreter golden uses ({})",
            crate::describe::env::python().program.display()
        ),
        RemoteKind::Attribute | RemoteKind::NotCallable => {
            format!("fix: `reference = \"{reference}\"` must name a function or an nn.Module class")
        }
        RemoteKind::NotModule => {
            "fix: a port that takes a VarBuilder is checked in module form; its \
                         reference must be an nn.Module class (or drop the VarBuilder parameter)"
                .into()
        }
        RemoteKind::Backend => format!(
            "fix: install torch into the interpreter golden used with `golden setup`, or \
             {} -m pip install torch; or choose `backend = \"numpy\"`",
            crate::describe::env::python().program.display()
        ),
        RemoteKind::Raised => {
            "the reference raised on this case; if the inputs are outside its domain, \
                     narrow `args(...)` (e.g. `~ uniform(lo, hi)`) or `dims(...)`"
                .into()
        }
        RemoteKind::Nondeterministic => {
            "fix: the reference must give the same outputs for the same inputs. \
                               Noise from np.random or random is not seeded by golden: draw it \
                               with torch (golden seeds torch's generator per case) or from a \
                               generator seeded by the reference itself; state that changes from \
                               call to call (a counter, a cache, a buffer that accumulates) must \
                               not change its answer. A port cannot be judged against an answer \
                               that changes"
                .into()
        }
        _ => return None,
    })
}

/// The kind of a reference-side error (`raised`, `nondeterministic`, ...).
fn remote_kind(e: Option<&WorkerError>) -> Option<&RemoteKind> {
    match e {
        Some(WorkerError::Remote(r)) => Some(&r.kind),
        _ => None,
    }
}

fn write_leaf(out: &mut String, leaf: &Leaf) -> fmt::Result {
    let shape = |s: &Option<(Vec<usize>, golden_files::WireDType)>| match s {
        Some((shape, dtype)) => format!("{dtype} {shape:?}"),
        None => "nothing".into(),
    };
    match &leaf.verdict {
        Verdict::Values(v) => {
            let pct = 100.0 * v.mismatched as f64 / v.numel.max(1) as f64;
            if v.mismatched == 0 {
                writeln!(
                    out,
                    "  leaf `{}` ({}): every element within its tolerance, but:",
                    leaf.name,
                    shape(&leaf.port),
                )?;
            } else {
                writeln!(
                    out,
                    "  leaf `{}` ({}): {} / {} elements differ ({pct:.1}%)",
                    leaf.name,
                    shape(&leaf.port),
                    v.mismatched,
                    v.numel
                )?;
            }
            if let Some(g) = &v.greatest_abs {
                writeln!(out, "    greatest absolute difference {} {g}", num(g.diff))?;
            }
            if let Some((rel, g)) = &v.greatest_rel {
                writeln!(out, "    greatest relative difference {} {g}", num(*rel))?;
            }
            let shown = |i: &Vec<usize>| {
                v.greatest_abs.as_ref().is_some_and(|g| &g.index == i)
                    || v.greatest_rel.as_ref().is_some_and(|(_, g)| &g.index == i)
            };
            if let Some(w) = v
                .worst
                .as_ref()
                .filter(|w| !shown(&w.index) && v.worst_ratio > 1.0)
            {
                writeln!(
                    out,
                    "    furthest outside its tolerance ({}× allowed) {w}",
                    num(v.worst_ratio)
                )?;
            }
            if let Some(g) = &v.first_nonfinite_mismatch {
                writeln!(out, "    first NaN/Inf on one side only {g}")?;
            }
            writeln!(
                out,
                "    NaN: port {}, reference {}; Inf: port {}, reference {}",
                v.nan.0, v.nan.1, v.inf.0, v.inf.1
            )?;
            write!(out, "    tolerance: |port − ref| ≤ {}", v.rule)?;
            match v.rounding_max {
                Some(r) => writeln!(out, " (largest rounding estimate here {})", num(r))?,
                None => writeln!(out)?,
            }
            if v.unexplained > 0 {
                writeln!(
                    out,
                    "    at {} element{} the reference in float64 is not the same computation, so \
                     there the bound has no rounding term (see the note below)",
                    v.unexplained,
                    if v.unexplained == 1 { "" } else { "s" }
                )?;
            }
            if v.unreliable > 0 {
                writeln!(
                    out,
                    "    {} element{} left out: the reference's own {} result is unreliable there \
                     (see the note below)",
                    v.unreliable,
                    if v.unreliable == 1 { " is" } else { "s are" },
                    leaf.reference.as_ref().map_or("?", |r| r.1.name())
                )?;
            }
            if v.unjudged > 0 {
                writeln!(
                    out,
                    "    the reference is NaN or ±Inf at {} element{} where its float64 run says \
                     otherwise (an overflow or a division by zero in its {} computation): golden \
                     cannot judge the port there, and takes no NaN or Inf of the port's for \
                     agreement (see the note below)",
                    v.unjudged,
                    if v.unjudged == 1 { "" } else { "s" },
                    leaf.reference.as_ref().map_or("?", |r| r.1.name())
                )?;
            }
            if let Some(a) = v.accuracy.filter(|a| !a.passes()) {
                let dtype = leaf.port.as_ref().map_or("?", |p| p.1.name());
                match a.axis {
                    None => writeln!(
                        out,
                        "    the port is markedly less accurate than its reference: its RMS error \
                         against the float64 result is {}, {}× the reference's own ({}; allowed \
                         {}×) — it computes in {dtype} where the reference computes in a higher \
                         precision (a missing upcast, e.g. a norm's variance or a softmax outside \
                         float32?)",
                        num(a.port),
                        num(a.ratio),
                        num(a.reference),
                        num(crate::judge::compare::ACCURACY_FACTOR),
                    )?,
                    Some(axis) => writeln!(
                        out,
                        "    the port is markedly less accurate than its reference along axis \
                         {axis}: the error its slices along that axis share (a scale or an offset \
                         per slice) is {} RMS against the float64 result, {}× what the \
                         reference's own rounding leaves there ({}; allowed {}×) — what a \
                         reduction over axis {axis} computed in {dtype} does where the reference \
                         computes it in a higher precision (a norm's variance or mean, a \
                         softmax's sum: a missing upcast), or an error confined to some slices",
                        num(a.port),
                        num(a.ratio),
                        num(a.reference),
                        num(crate::judge::compare::ACCURACY_FACTOR),
                    )?,
                }
            }
            Ok(())
        }
        Verdict::Shape { hint } => writeln!(
            out,
            "  leaf `{}`: shape {} but the reference's is {} — {hint}",
            leaf.name,
            shape(&leaf.port),
            shape(&leaf.reference)
        ),
        Verdict::DType if crate::judge::trace::is_trace(&leaf.name) => writeln!(
            out,
            "  trace point `{}`: the port computes it in {}, the reference in {} — an \
             intermediate in another precision than the reference's (an upcast not undone, a \
             dtype an op passes on: candle keeps the dtype its inputs have), and what follows it \
             computes in that precision too; convert it (`.to_dtype(..)`) where the reference does",
            leaf.name.trim_start_matches(crate::judge::trace::PREFIX),
            shape(&leaf.port),
            shape(&leaf.reference)
        ),
        Verdict::DType => writeln!(
            out,
            "  leaf `{}`: the port returns {}, the reference {} — convert the output \
             (`.to_dtype(..)`) to the reference's dtype",
            leaf.name,
            shape(&leaf.port),
            shape(&leaf.reference)
        ),
        Verdict::MissingInPort => writeln!(
            out,
            "  leaf `{}` ({}): the reference returns it, the port does not",
            leaf.name,
            shape(&leaf.reference)
        ),
        Verdict::MissingInReference => writeln!(
            out,
            "  leaf `{}` ({}): the port returns it, the reference does not",
            leaf.name,
            shape(&leaf.port)
        ),
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let dtype = self.dtype.map(|d| format!(" in {d}")).unwrap_or_default();
        match &self.kind {
            FailureKind::Config(m) => {
                writeln!(out, "golden: cannot check `{}`: {m}", self.layer)?;
            }
            FailureKind::Setup(e) => {
                writeln!(
                    out,
                    "golden: `{}` could not reach its reference `{}`:\n  {e}",
                    self.layer, self.reference
                )?;
                if let Some(fix) = remote_fix(e, &self.reference) {
                    writeln!(out, "  {fix}")?;
                }
            }
            FailureKind::Worker(e) => {
                writeln!(
                    out,
                    "golden: `{}`: the reference `{}` failed{dtype}:\n  {e}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c)
                if remote_kind(c.reference_error.as_ref())
                    == Some(&RemoteKind::Nondeterministic) =>
            {
                writeln!(
                    out,
                    "golden: `{}`: its reference `{}` is not deterministic{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c)
                if remote_kind(c.reference_error.as_ref()) == Some(&RemoteKind::Store) =>
            {
                writeln!(
                    out,
                    "golden: `{}`: its golden store disagrees with its reference `{}`{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c) if c.reference_error.is_some() => {
                writeln!(
                    out,
                    "golden: `{}`: its reference `{}` failed on a generated case{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c) if c.port.is_some() && c.params.is_empty() => {
                writeln!(
                    out,
                    "golden: `{}` failed on a generated case{dtype} (reference `{}`)",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c) if !c.unknown_taps.is_empty() => {
                let n = c.unknown_taps.len();
                writeln!(
                    out,
                    "golden: `{}` taps {} its reference `{}` does not have{dtype}",
                    self.layer,
                    if n == 1 {
                        "a point".to_string()
                    } else {
                        format!("{n} points")
                    },
                    self.reference
                )?;
            }
            FailureKind::Case(c) if !c.invariants.is_empty() => {
                let first = &c.invariants[0];
                writeln!(
                    out,
                    "golden: `{}` breaks the invariant `{}` declared for its output `{}` \
                     (reference `{}`){dtype}",
                    self.layer, first.invariant, first.leaf, self.reference
                )?;
            }
            FailureKind::Case(c)
                if c.schedule_issues
                    .iter()
                    .any(|i| matches!(i, crate::report::issues::ScheduleIssue::Sampler(_))) =>
            {
                writeln!(
                    out,
                    "golden: `{}` matches its reference `{}` step by step, but its sampler does \
                     not draw as transformers' does{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c) if !c.schedule_issues.is_empty() => {
                writeln!(
                    out,
                    "golden: `{}` matches its reference `{}` step by step, but not through \
                     time{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(c) if self.first_failing_step(c).is_some() => {
                let (steps, k) = self.first_failing_step(c).expect("checked");
                writeln!(
                    out,
                    "golden: `{}` leaves its reference `{}` at {}{dtype}",
                    self.layer,
                    self.reference,
                    steps.describe(k)
                )?;
            }
            FailureKind::Case(c) if crate::judge::trace::first_divergence(&c.leaves).is_some() => {
                let tapped = c
                    .leaves
                    .iter()
                    .filter(|l| crate::judge::trace::is_trace(&l.name))
                    .count();
                let (at, leaf) = crate::judge::trace::first_divergence(&c.leaves).expect("checked");
                writeln!(
                    out,
                    "golden: `{}` leaves its reference `{}` at `{}` (trace point {} of {tapped} \
                     tapped){dtype}",
                    self.layer,
                    self.reference,
                    leaf.name.trim_start_matches(crate::judge::trace::PREFIX),
                    at + 1
                )?;
            }
            FailureKind::Case(c) if self.check == crate::describe::checks::Kind::Gradients => {
                let forward = c
                    .gradient_issues
                    .first()
                    .is_some_and(GradientIssue::is_forward_differs);
                writeln!(
                    out,
                    "golden: the gradients of `{}` do not match{} (reference `{}`){dtype}",
                    self.layer,
                    if forward {
                        ", and neither does its forward"
                    } else {
                        ""
                    },
                    self.reference
                )?;
            }
            FailureKind::Case(c) if c.outputs_differ_in_structure() => {
                writeln!(
                    out,
                    "golden: `{}` returns outputs of another structure than its reference `{}`{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(_) if self.check == crate::describe::checks::Kind::Overfit => {
                writeln!(
                    out,
                    "golden: `{}` does not train like its reference `{}`{dtype}",
                    self.layer, self.reference
                )?;
            }
            FailureKind::Case(_) => {
                writeln!(
                    out,
                    "golden: `{}` does not match its reference `{}`{dtype}",
                    self.layer, self.reference
                )?;
            }
        }
        if let Some(case) = &self.case {
            write!(out, "  case: {case}")?;
            match &self.shrunk_from {
                Some((from, steps)) if from != case => writeln!(
                    out,
                    "\n        (the smallest failing case; shrunk in {steps} steps from {from})"
                )?,
                _ => writeln!(out)?,
            }
            if self.passed_before > 0 {
                writeln!(
                    out,
                    "  {} case{} passed before this one failed",
                    self.passed_before,
                    if self.passed_before == 1 { "" } else { "s" }
                )?;
            }
            if !case.config.is_empty() {
                let configuration: Vec<String> = case
                    .config
                    .iter()
                    .map(|p| format!("{} = {}", p.field, p.shown))
                    .collect();
                write!(out, "  configuration: {}", configuration.join(", "))?;
                if self.passed_configurations.is_empty() {
                    writeln!(out)?;
                } else {
                    let passed: Vec<String> = self
                        .passed_configurations
                        .iter()
                        .map(|(c, n)| format!("{c} ({n} case{})", if *n == 1 { "" } else { "s" }))
                        .collect();
                    writeln!(out, "; passed before with {}", passed.join(", "))?;
                }
            }
        }
        if let FailureKind::Case(c) = &self.kind {
            if let Some(e) = &c.inputs_error {
                writeln!(out, "  the inputs could not be generated: {e}")?;
            }
            if !c.gradient_issues.is_empty() {
                writeln!(out, "  the port's gradients:")?;
                for g in &c.gradient_issues {
                    writeln!(out, "    - {g}")?;
                }
            }
            if !c.training_issues.is_empty() {
                writeln!(out, "  the training:")?;
                for t in &c.training_issues {
                    writeln!(out, "    - {t}")?;
                }
            }
            if !c.schedule_issues.is_empty() {
                writeln!(out, "  through the schedule:")?;
                for t in &c.schedule_issues {
                    writeln!(out, "    - {t}")?;
                }
            }
            if !c.invariants.is_empty() {
                writeln!(out, "  declared invariants of the outputs, broken:")?;
                for v in &c.invariants {
                    writeln!(out, "    - {v}")?;
                }
            }
            if !c.unknown_taps.is_empty() {
                writeln!(
                    out,
                    "  taps whose names the reference's trace does not have (a typo would \
                     otherwise compare nothing):"
                )?;
                for t in &c.unknown_taps {
                    writeln!(out, "    - {t}")?;
                }
            }
            if !c.params.is_empty() {
                writeln!(
                    out,
                    "  the port and the reference module's state_dict disagree:"
                )?;
                for p in &c.params {
                    writeln!(out, "    - {p}")?;
                }
            }
            if let Some(e) = &c.port {
                if matches!(e, PortFault::TimedOut(_)) || c.params.is_empty() {
                    writeln!(out, "  {e}")?;
                }
            }
            if let Some(e) = &c.reference_error {
                writeln!(out, "  {e}")?;
                if let Some(fix) = remote_fix(e, &self.reference) {
                    writeln!(out, "  {fix}")?;
                }
            }
            let first_divergence = crate::judge::trace::first_divergence(&c.leaves).map(|(_, l)| l);
            if first_divergence.is_some() {
                write_trace(&mut out, c)?;
            }
            let first_step = self.first_failing_step(c);
            if let Some((steps, k)) = first_step {
                write_steps(&mut out, c, steps, k)?;
            }
            // Of the trace points, only the first divergence is detailed: later ones inherit it;
            // of a schedule's steps, only the first that differs.
            let failing: Vec<&Leaf> = c
                .leaves
                .iter()
                .filter(|l| !l.passes())
                .filter(|l| {
                    !crate::judge::trace::is_trace(&l.name)
                        || first_divergence.is_some_and(|f| std::ptr::eq(*l, f))
                })
                .filter(
                    |l| match (first_step, crate::describe::schedule::step_of(&l.name)) {
                        (Some((_, first)), Some((k, _))) => k == first,
                        _ => true,
                    },
                )
                .collect();
            if !failing.is_empty() {
                let outputs = c
                    .leaves
                    .iter()
                    .filter(|l| !crate::judge::trace::is_trace(&l.name));
                let total = outputs.clone().count();
                let differ = outputs.filter(|l| !l.passes()).count();
                let passing = total - differ;
                writeln!(
                    out,
                    "  {differ} of {total} output leaves differ{}{}:",
                    if passing > 0 {
                        format!(" ({passing} match)")
                    } else {
                        String::new()
                    },
                    if first_divergence.is_some() {
                        "; of the trace points, the first that differs"
                    } else {
                        ""
                    }
                )?;
                for leaf in failing {
                    write_leaf(&mut out, leaf)?;
                }
            }
            if let Some((port, reference)) = crate::report::structure::mismatch(&c.leaves) {
                writeln!(
                    out,
                    "  the port returns {}, the reference {} — fix: {} (said on the first case: no \
                     case changes what a port returns)",
                    crate::report::structure::describe(&port),
                    crate::report::structure::describe(&reference),
                    crate::report::structure::fix(&reference)
                )?;
            }
            let (causes, evidence): (Vec<&LeafDiagnosis>, Vec<&LeafDiagnosis>) =
                c.diagnoses.iter().partition(|d| d.confirmed);
            if !causes.is_empty() {
                writeln!(out, "  likely causes:")?;
                for d in causes {
                    let on = d
                        .on_first_case
                        .as_ref()
                        .map(|case| format!(" (on another failing case, {case})"))
                        .unwrap_or_default();
                    writeln!(out, "    - `{}`{on}: {}", d.leaf, d.diagnosis)?;
                }
            }
            if !evidence.is_empty() {
                let why = if c.other_cases == 0 {
                    "no other failing case to test it on"
                } else {
                    "it does not hold on the other"
                };
                writeln!(
                    out,
                    "  evidence from one failing case only ({why}, so it names no cause):"
                )?;
                for d in evidence {
                    let on = d
                        .on_first_case
                        .as_ref()
                        .map_or("the smallest case".to_string(), |case| case.to_string());
                    writeln!(out, "    - `{}` on {on}: {}", d.leaf, d.diagnosis.evidence)?;
                }
            }
            for v in &c.variants {
                writeln!(
                    out,
                    "  the port matches `{}`, a known variant of the reference (max diff {}): {}",
                    v.name,
                    num(v.max_diff),
                    v.fix
                )?;
            }
            for (i, m) in c.mutations.iter().enumerate() {
                write_mutation(&mut out, i, m)?;
            }
            for note in &c.notes {
                writeln!(out, "  note: {}", note.detail)?;
            }
            if let Some(e) = &c.precise_error {
                if !failing_is_empty(c) {
                    writeln!(
                        out,
                        "  note: the reference could not run in float64 ({e}), so the tolerance has \
                         no rounding term"
                    )?;
                }
            }
        }
        for note in &self.notes {
            writeln!(out, "  {note}")?;
        }
        f.write_str(out.trim_end())
    }
}

/// A schedule's failed case through time: each step, and whether it differs from the reference's
/// cached run and from its one-shot forward.
fn write_steps(
    out: &mut String,
    c: &CaseFailure,
    steps: &crate::describe::schedule::Steps,
    first: usize,
) -> fmt::Result {
    use crate::describe::schedule::step_of;
    let (first_kind, second_kind) = if steps.looped {
        writeln!(
            out,
            "  through the loop ({steps}), each step teacher-forced (from the reference's state) \
             and free-running (from the port's own):"
        )?;
        (("step.", "teacher-forced"), ("free.", "free-running"))
    } else {
        writeln!(
            out,
            "  through the schedule ({steps}), each step against the reference's cached run and \
             its one-shot forward of the whole sequence:"
        )?;
        (("step.", "cached"), ("oneshot.", "one-shot"))
    };
    let verdict = |k: usize, prefix: &str| {
        let mut leaves = c.leaves.iter().filter(|l| {
            l.name.starts_with(prefix) && step_of(&l.name).is_some_and(|(s, _)| s == k)
        });
        let first = leaves.next();
        match first {
            None => "—".to_string(),
            Some(l) => {
                let all: Vec<&Leaf> = std::iter::once(l).chain(leaves).collect();
                let worst = all
                    .iter()
                    .map(|l| match &l.verdict {
                        Verdict::Values(v) => v.worst_ratio,
                        _ => f64::INFINITY,
                    })
                    .fold(0.0, f64::max);
                let mark = if all.iter().all(|l| l.passes()) {
                    "ok"
                } else {
                    "DIFFERS"
                };
                format!("{mark} ({}×)", num(worst))
            }
        }
    };
    for k in 0..steps.lengths().len() {
        let arrow = if k == first { "  <- first" } else { "" };
        writeln!(
            out,
            "    {}: {} {}, {} {}{arrow}",
            steps.describe(k),
            first_kind.1,
            verdict(k, first_kind.0),
            second_kind.1,
            verdict(k, second_kind.0)
        )?;
    }
    Ok(())
}

/// The trace of a failed case: every tapped point in the reference's execution order with its error
/// relative to its tolerance, the drift line, and the points the port did not tap.
/// A trace of up to this many points is shown whole in a failure message.
const TRACE_SHOWN: usize = 40;
/// Points shown before and after the first divergence in a longer one.
const TRACE_BEFORE: usize = 3;
const TRACE_AFTER: usize = 6;

fn write_trace(out: &mut String, c: &CaseFailure) -> fmt::Result {
    let points: Vec<&Leaf> = c
        .leaves
        .iter()
        .filter(|l| crate::judge::trace::is_trace(&l.name))
        .collect();
    let first = crate::judge::trace::first_divergence(&c.leaves).map(|(i, _)| i);
    let width = points
        .iter()
        .map(|l| l.name.len() - crate::judge::trace::PREFIX.len())
        .max()
        .unwrap_or(0);
    writeln!(
        out,
        "  the trace, in the reference's execution order (|port − ref| / allowed, worst element):"
    )?;
    // A whole model's trace has hundreds of points: the message shows a window around the first
    // divergence (and the last point, where the output is) and says what it left out; the whole
    // table is in the artifacts (`trace/`) and the HTML report.
    let shown = |i: usize| match first {
        _ if points.len() <= TRACE_SHOWN => true,
        Some(f) => {
            (f.saturating_sub(TRACE_BEFORE)..=f + TRACE_AFTER).contains(&i) || i + 1 == points.len()
        }
        None => i < TRACE_SHOWN,
    };
    let mut skipped = 0usize;
    for (i, leaf) in points.iter().enumerate() {
        if !shown(i) {
            skipped += 1;
            continue;
        }
        if skipped > 0 {
            writeln!(out, "    {:>3} … {skipped} more", "")?;
            skipped = 0;
        }
        let name = leaf.name.trim_start_matches(crate::judge::trace::PREFIX);
        let figure = match &leaf.verdict {
            Verdict::Values(v) => format!("{:>9}", num(v.worst_ratio)),
            Verdict::Shape { .. } => "    shape".into(),
            Verdict::DType => {
                let dtype = |s: &Option<(Vec<usize>, golden_files::WireDType)>| {
                    s.as_ref().map_or("?", |(_, d)| d.name())
                };
                format!(
                    "{:>9}",
                    format!("{}≠{}", dtype(&leaf.port), dtype(&leaf.reference))
                )
            }
            _ => "        —".into(),
        };
        let mark = match (leaf.passes(), Some(i) == first) {
            (true, _) => "ok",
            (false, true) => "DIFFERS  <- first divergence",
            (false, false) => "differs",
        };
        writeln!(out, "    {:>3} {name:<width$} {figure}  {mark}", i + 1)?;
    }
    if skipped > 0 {
        writeln!(out, "    {:>3} … {skipped} more", "")?;
    }
    if points.len() > TRACE_SHOWN {
        let differ = points.iter().filter(|l| !l.passes()).count();
        let before = first.map_or(points.len(), |f| f);
        writeln!(
            out,
            "  {} trace points: {before} agree before the first divergence, {differ} differ in \
             all; the whole table is in the artifacts' trace/ and the HTML report",
            points.len()
        )?;
    }
    writeln!(
        out,
        "  drift against depth: {}  (▁ far inside the tolerance … █ 10× outside)",
        crate::judge::trace::drift_line(&c.leaves)
    )?;
    if !c.untapped.is_empty() {
        let names: Vec<&str> = c
            .untapped
            .iter()
            .map(|n| n.trim_start_matches(crate::judge::trace::PREFIX))
            .collect();
        let shown = names.len().min(8);
        writeln!(
            out,
            "  not tapped by the port ({} reference points): {}{}",
            names.len(),
            names[..shown].join(", "),
            if names.len() > shown { ", …" } else { "" }
        )?;
    }
    Ok(())
}

/// "likely cause: the port matches the reference with WHAT at SITE (instead of INSTEAD) on both
/// failing cases (max diff …), where the reference reads \`CODE\` — fix: FIX"; the second and
/// third read "or: ...". A match on one failing case alone reads as evidence, without a fix.
fn write_mutation(out: &mut String, i: usize, m: &MutationMatch) -> fmt::Result {
    let code = m
        .code
        .as_ref()
        .map(|c| format!(", where the reference reads `{c}`"))
        .unwrap_or_default();
    if m.second.is_some() {
        return writeln!(
            out,
            "  and a second mistake, made together with the first on the other failing case: {} \
             (max diff {}){code} — fix: {}",
            m.claim(),
            num(m.fit.max_diff),
            m.fix
        );
    }
    if !m.both_cases {
        let lead = if i == 0 { "evidence" } else { "or" };
        return writeln!(
            out,
            "  {lead}: on one failing case {} (max diff {}){code}, which would mean: {}",
            m.claim(),
            num(m.fit.max_diff),
            m.fix
        );
    }
    let lead = if i == 0 { "likely cause" } else { "or" };
    writeln!(
        out,
        "  {lead}: {} on both failing cases (max diff {}){code} — fix: {}",
        m.claim(),
        num(m.fit.max_diff),
        m.fix
    )
}

fn failing_is_empty(c: &CaseFailure) -> bool {
    c.leaves.iter().all(Leaf::passes)
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::compare::{compare_leaf, Expected, ROUNDING_FACTOR};
    use golden_files::HostTensor;

    /// A whole model's trace: 60 points, the first 40 agree, then all differ.
    fn long_trace() -> CaseFailure {
        let same = HostTensor::from_f64(vec![2], &[1.0, 2.0]);
        let off = HostTensor::from_f64(vec![2], &[1.0, 3.0]);
        let leaves = (0..60)
            .map(|i| {
                let port = if i < 40 { &same } else { &off };
                let e = Expected {
                    value: &same,
                    rounding: None,
                    precise: None,
                };
                let name = format!("{}model.layers.{i}", crate::judge::trace::PREFIX);
                compare_leaf(&name, port, &e, None, ROUNDING_FACTOR)
            })
            .collect();
        CaseFailure {
            leaves,
            ..CaseFailure::default()
        }
    }

    #[test]
    fn a_long_trace_is_shown_as_a_window_around_its_first_divergence() {
        let mut out = String::new();
        write_trace(&mut out, &long_trace()).unwrap();
        // The window: three points before the first divergence, it, six after, and the last.
        for shown in [37, 38, 39, 40, 46, 59] {
            assert!(
                out.contains(&format!("model.layers.{shown} ")),
                "point {shown} not shown:\n{out}"
            );
        }
        for hidden in [0, 36, 47, 58] {
            assert!(
                !out.contains(&format!("model.layers.{hidden} ")),
                "point {hidden} shown:\n{out}"
            );
        }
        assert!(out.contains("model.layers.40 ") && out.contains("<- first divergence"));
        assert!(out.contains("… 37 more"), "{out}");
        assert!(out.contains("… 12 more"), "{out}");
        assert!(
            out.contains(
                "60 trace points: 40 agree before the first divergence, 20 differ in all; the \
                 whole table is in the artifacts' trace/ and the HTML report"
            ),
            "{out}"
        );
        assert!(out.lines().count() < 20, "{out}");
    }
}
