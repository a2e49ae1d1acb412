//! The mutation diagnosis's request: on a failing case, the worker re-runs the reference with one
//! of its torch calls (or submodule calls) mutated into a porting mistake
//! (`reference_py/golden_ref/mutations.py`; the operator-level families in `families.py`, submodule
//! mistakes in `structure.py`, named entries in `catalogue.py`) and answers with the mutants that
//! move toward the port's outputs, each evaluated like a reference (case dtype, float64, nudged),
//! within the seconds it is given. `judge::mutations` decides which the port matches.
//!
//! It needs Python. Live and recording sources have it; a replay starts a worker for it only when
//! the interpreter visibly has torch (or `GOLDEN_MUTATIONS=always`), so that a replay on a machine
//! without PyTorch never starts Python and says the diagnosis was skipped.

use crate::answers::live::{
    add_schedule, decode_outputs, input_scale, Live, ReferenceOutputs, State,
};
use crate::answers::source::Source;
use crate::describe::env::{self, Mutations};
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::describe::schedule::Plan;
use crate::python::wire::{self, TensorTable};
use crate::python::worker::WorkerError;
use candle_core::DType;
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::path::Path;
use std::time::Duration;

/// One mutant of the reference that moved toward the port on a case.
#[derive(Clone, Debug)]
pub struct Mutant {
    /// Identifies the mutation across cases (kind, option, call site).
    pub key: String,
    /// The mutated call, e.g. `F.gelu(approximate='tanh')`.
    pub what: String,
    /// What the reference does instead.
    pub instead: String,
    /// Where in the reference's source (empty for a mutation of the inputs).
    pub site: String,
    /// The fix, in candle terms.
    pub fix: String,
    /// Its family: `drop`, `operands`, `boundary`, `constant`, `activation`, `axes`,
    /// `precision`, `structure`, `catalogue`, `yours`, `inputs`.
    pub kind: String,
    /// The reference's source line at the site, when it is known.
    pub code: Option<String>,
    /// Its outputs and their rounding estimate, as for the reference.
    pub outputs: ReferenceOutputs,
}

/// What the worker did on one case.
#[derive(Clone, Debug, Default)]
pub struct Search {
    /// Torch calls the reference made that some mutation applies to.
    pub calls: usize,
    /// Their distinct call sites.
    pub sites: usize,
    /// Mutations that applied.
    pub candidates: usize,
    /// Mutations evaluated (fewer than `candidates` when the time budget ran out).
    pub tried: usize,
    /// Per kind of mutation: (kind, candidates, tried in the cheap pass).
    pub kinds: Vec<(String, usize, usize)>,
    /// Whether the time budget ran out.
    pub truncated: bool,
    /// Where it ran out: `cheap pass` or `full evaluations`.
    pub stage: Option<String>,
    /// The worker's time for the whole search.
    pub seconds: f64,
    /// The seconds it was given.
    pub budget: f64,
    /// The closest mutants, evaluated in full.
    pub mutants: Vec<Mutant>,
}

/// Full evaluations per case: the closest mutants after the cheap pass.
const KEEP: usize = 6;

/// What a search is given besides the case: the trace point where the port first left the
/// reference (its candidates are tried first), the seconds it may take, and, with `only`, the
/// mutations to evaluate (by key: those that matched on another case).
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    /// The submodule a trace saw diverge first (`layers.0.self_attn`), if any.
    pub focus: Option<&'a str>,
    /// The seconds the worker may spend on the search.
    pub budget: f64,
    /// Just these mutations, evaluated in full.
    pub only: Option<&'a [String]>,
    /// A mutation (its key) made in every candidate: the search is of a second mistake on top
    /// of it.
    pub base: Option<&'a str>,
    /// A mistake of driving made in the schedule of every candidate (with `only`, the first
    /// mistake's key: that mistake and a mistake of driving together).
    pub mistake: Option<crate::describe::schedule::Mistake>,
}

impl Live {
    /// Search the mutants of the reference that move toward `port` on one case, as `ask` says.
    /// `state`: the module's parameters of the case, as for any request about it; `sizes`: the
    /// case's named sizes (its dims and fixed axes), which name a constant.
    #[allow(clippy::too_many_arguments)]
    pub fn mutations(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
        port: &[(String, HostTensor)],
        state: Option<State<'_>>,
        sizes: &[(String, usize)],
        ask: Ask<'_>,
        plan: Option<&Plan>,
    ) -> Result<Search, WorkerError> {
        let mut table = TensorTable::default();
        let mut header = self.header(layer, dtype, seed, args, state, &mut table);
        add_schedule(&mut header, plan, &mut table);
        let scale = input_scale(args, state);
        header["op"] = json!("mutations");
        header["names"] = json!(layer.args.iter().map(|a| &a.name).collect::<Vec<_>>());
        header["port"] = Json::Array(
            port.iter()
                .map(|(name, t)| json!([name, table.add(t.clone())]))
                .collect(),
        );
        header["keep"] = json!(KEEP);
        header["sizes"] = json!(sizes);
        if let Some(keys) = ask.only {
            header["only"] = json!(keys);
        }
        if let Some(base) = ask.base {
            header["base"] = json!(base);
        }
        if let Some(focus) = ask.focus {
            header["focus"] = json!(focus);
        }
        header["budget"] = json!(ask.budget);
        // The worker keeps to its budget; the request's own limit only catches a single
        // evaluation of the reference that overruns it (and kills that worker).
        let limit = Duration::from_secs_f64(ask.budget + (ask.budget / 2.0).max(5.0));
        let (response, tensors) = self.send(
            header,
            table.tensors,
            state,
            limit,
            "mutating the reference to explain the failure",
        )?;
        let protocol = |e: wire::WireError| WorkerError::Protocol(e.to_string());
        let text = |v: &Json, k: &str| v[k].as_str().unwrap_or_default().to_string();
        let count = |k: &str| response[k].as_u64().unwrap_or(0) as usize;
        let mutants = response["mutants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                Ok(Mutant {
                    key: text(m, "key"),
                    what: text(m, "what"),
                    instead: text(m, "instead"),
                    site: text(m, "where"),
                    fix: text(m, "fix"),
                    kind: text(m, "kind"),
                    code: m["code"].as_str().map(str::to_string),
                    outputs: decode_outputs(&m["outputs"], &tensors, None, scale)
                        .map_err(protocol)?,
                })
            })
            .collect::<Result<Vec<_>, WorkerError>>()?;
        let kinds = response["kinds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| {
                Some((
                    k[0].as_str()?.to_string(),
                    k[1].as_u64()? as usize,
                    k[2].as_u64()? as usize,
                ))
            })
            .collect();
        Ok(Search {
            calls: count("calls"),
            sites: count("sites"),
            candidates: count("candidates"),
            tried: count("tried"),
            kinds,
            truncated: response["truncated"].as_bool().unwrap_or(false),
            stage: response["stage"].as_str().map(str::to_string),
            seconds: response["seconds"].as_f64().unwrap_or(0.0),
            budget: response["budget"].as_f64().unwrap_or(ask.budget),
            mutants,
        })
    }
}

/// Whether an interpreter visibly has torch without running it: a `bin/python` (a venv's, or a
/// system's) with `lib/python*/{site,dist}-packages/torch` beside it.
fn torch_visible(program: &Path) -> bool {
    crate::python::key::site_packages(program)
        .iter()
        .any(|p| p.join("torch").join("__init__.py").is_file())
}

/// Why a search did not run or did not finish.
#[derive(Debug)]
pub enum Skipped {
    /// It did not run: the reason (GOLDEN_MUTATIONS=off, no torch in a replay, ...).
    Not(String),
    /// The worker overran the budget (one evaluation of the reference took longer than the
    /// whole budget) and was stopped.
    OutOfTime(f64),
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::Not(why) => f.write_str(why),
            Skipped::OutOfTime(budget) => write!(
                f,
                "it did not finish within its budget of {} s (a third of the reference's \
                 timeout) and was stopped",
                crate::describe::numbers::num(*budget)
            ),
        }
    }
}

/// Run the mutation search on one failing case through `source`, as `ask` says: `Err` says why
/// it was skipped or stopped.
pub fn search(
    source: &Source,
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    args: &[HostTensor],
    port: &[(String, HostTensor)],
    ask: Ask<'_>,
) -> Result<Search, Skipped> {
    let mode = env::mutations().map_err(Skipped::Not)?;
    if mode == Mutations::Off {
        return Err(Skipped::Not("GOLDEN_MUTATIONS=off".into()));
    }
    // Module form: the parameters the case ran with (drawn, or a checkpoint's).
    let state = source
        .module_state(layer, dtype, params)
        .map_err(|e| Skipped::Not(e.to_string()))?;
    let on_demand;
    let live = match source.live() {
        Some(live) => live,
        None => {
            let python = env::python();
            if mode == Mutations::Auto && !torch_visible(&python.program) {
                return Err(Skipped::Not(format!(
                    "this is a replay and the interpreter ({}, from {}) shows no torch; \
                     GOLDEN_MUTATIONS=always starts it anyway",
                    python.program.display(),
                    python.source
                )));
            }
            on_demand = Live::new(layer).map_err(Skipped::Not)?;
            on_demand
                .load(layer)
                .map_err(|e| Skipped::Not(format!("the reference is not reachable live: {e}")))?;
            &on_demand
        }
    };
    let mut plan = params.plan(layer);
    if let (Some(plan), Some(mistake)) = (plan.as_mut(), ask.mistake) {
        plan.mistake = Some(mistake);
    }
    let sizes = params.sizes(layer);
    let layer = &*params.layer(layer);
    live.mutations(
        layer,
        dtype,
        params.seed,
        args,
        port,
        state.as_ref().map(|s| s.as_state()),
        &sizes,
        ask,
        plan.as_ref(),
    )
    .map_err(|e| match e {
        WorkerError::Timeout { .. } => Skipped::OutOfTime(ask.budget),
        e => Skipped::Not(e.to_string()),
    })
}

/// The seconds the whole diagnosis of a failure may take: a third of the reference's timeout
/// (with no timeout, a third of the default's, 60 s).
pub fn budget(layer: &Layer) -> f64 {
    let timeout = layer
        .timeout
        .or_else(|| env::timeout().ok())
        .filter(|t| *t != Duration::MAX)
        .unwrap_or(Duration::from_secs(60));
    timeout.as_secs_f64() / 3.0
}
