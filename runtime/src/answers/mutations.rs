//! The mutation diagnosis's request: on a failing case, the worker re-runs the reference with one of
//! its torch calls mutated into a common porting mistake (`reference_py/golden_ref/mutations.py`,
//! catalogue in `catalogue.py`) and answers with the mutants that move toward the port's outputs,
//! each evaluated like a reference (case dtype, float64, nudged). `judge::mutations` decides which
//! the port matches.
//!
//! It needs Python. Live and recording sources have it; a replay starts a worker for it only when
//! the interpreter visibly has torch (or `GOLDEN_MUTATIONS=always`), so that a replay on a machine
//! without PyTorch never starts Python and says the diagnosis was skipped.

use crate::answers::live::{
    add_schedule, decode_outputs, input_scale, Live, Named, ReferenceOutputs,
};
use crate::answers::source::Source;
use crate::describe::env::{self, Mutations};
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::describe::schedule::Plan;
use crate::python::wire::{self, TensorTable};
use crate::python::worker::{pool, WorkerError};
use candle_core::DType;
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::path::Path;

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
    /// Its outputs and their rounding estimate, as for the reference.
    pub outputs: ReferenceOutputs,
}

/// What the worker did on one case.
#[derive(Clone, Debug, Default)]
pub struct Search {
    /// Torch calls the reference made that the catalogue knows.
    pub calls: usize,
    /// Their distinct call sites.
    pub sites: usize,
    /// Mutations that applied.
    pub candidates: usize,
    /// Mutations evaluated (fewer than `candidates` when the time budget ran out).
    pub tried: usize,
    /// Whether the time budget ran out.
    pub truncated: bool,
    /// The worker's time for the whole search.
    pub seconds: f64,
    /// The closest mutants, evaluated in full.
    pub mutants: Vec<Mutant>,
}

/// Full evaluations per case: the closest mutants after the cheap pass.
const KEEP: usize = 6;

impl Live {
    /// Search the mutants of the reference that move toward `port` on one case; with `only`, just
    /// evaluate those (by key: the ones that matched on another case). `state`: the module's
    /// parameters of the case, as for any request about it.
    #[allow(clippy::too_many_arguments)]
    pub fn mutations(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
        port: &[(String, HostTensor)],
        state: Option<&Named>,
        only: Option<&[String]>,
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
        if let Some(keys) = only {
            header["only"] = json!(keys);
        }
        // The cheap pass stops after a third of the request's timeout; the full evaluations of the
        // few closest mutants fit in the rest.
        header["budget"] = json!(self.timeout().as_secs_f64() / 3.0);
        let mut worker = pool().check_out(self.key())?;
        let (response, tensors) = worker.request(
            header,
            table.tensors,
            self.timeout(),
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
                    outputs: decode_outputs(&m["outputs"], &tensors, None, scale)
                        .map_err(protocol)?,
                })
            })
            .collect::<Result<Vec<_>, WorkerError>>()?;
        Ok(Search {
            calls: count("calls"),
            sites: count("sites"),
            candidates: count("candidates"),
            tried: count("tried"),
            truncated: response["truncated"].as_bool().unwrap_or(false),
            seconds: response["seconds"].as_f64().unwrap_or(0.0),
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

/// Run the mutation search on one failing case through `source` (with `only`, just those
/// mutations): `Err` says why it was skipped.
pub fn search(
    source: &Source,
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    args: &[HostTensor],
    port: &[(String, HostTensor)],
    only: Option<&[String]>,
) -> Result<Search, String> {
    let mode = env::mutations()?;
    if mode == Mutations::Off {
        return Err("GOLDEN_MUTATIONS=off".into());
    }
    // Module form: the parameters the case ran with (drawn, or a checkpoint's).
    let state = source
        .module_state(layer, dtype, params)
        .map_err(|e| e.to_string())?;
    let on_demand;
    let live = match source.live() {
        Some(live) => live,
        None => {
            let python = env::python();
            if mode == Mutations::Auto && !torch_visible(&python.program) {
                return Err(format!(
                    "this is a replay and the interpreter ({}, from {}) shows no torch; \
                     GOLDEN_MUTATIONS=always starts it anyway",
                    python.program.display(),
                    python.source
                ));
            }
            on_demand = Live::new(layer)?;
            on_demand
                .load(layer)
                .map_err(|e| format!("the reference is not reachable live: {e}"))?;
            &on_demand
        }
    };
    let plan = params.plan(layer);
    let layer = &*layer.for_case(&params.dims);
    live.mutations(
        layer,
        dtype,
        params.seed,
        args,
        port,
        state.as_ref(),
        only,
        plan.as_ref(),
    )
    .map_err(|e| e.to_string())
}
