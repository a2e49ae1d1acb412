//! Where a check's reference outputs come from: the live Python worker, the golden store, or both.
//!
//! `GOLDEN_MODE` picks: `live` runs the reference and fails if it cannot; `replay` never starts
//! Python and answers from the store; `record` runs live and writes the store; `auto` (the default)
//! is live where the interpreter and the reference import, else replay, and says which it used.

use crate::answers::live::{Live, ReferenceOutputs, Request, VariantOutputs};
use crate::answers::store::{self, Entry, Store};
use crate::describe::env::Mode;
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::python::worker::WorkerError;
use candle_core::DType;
use golden_files::HostTensor;
use serde_json::Value as Json;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

/// The reference's answer for one case.
pub enum Answer {
    /// Its outputs.
    Outputs(ReferenceOutputs),
    /// Replay: the store has nothing for this case.
    Unrecorded,
    /// The reference could not answer.
    Failed(WorkerError),
}

impl Answer {
    /// The worker's own failure (it died, hung, spoke garbage), as opposed to the reference
    /// raising or a case missing from the store: what stops record mode's reference-only runs.
    pub fn dead_worker(self) -> Option<WorkerError> {
        match self {
            Answer::Failed(e) if !matches!(e, WorkerError::Remote(_)) => Some(e),
            _ => None,
        }
    }
}

/// Cases evaluated live while recording, in order.
#[derive(Default)]
pub struct Recording {
    entries: Vec<Entry>,
    index: HashMap<u64, usize>,
    /// Their size as the store's bound counts it.
    size: usize,
}

/// Where reference outputs come from.
pub enum Source {
    /// The Python worker.
    Live(Live),
    /// The golden store.
    Replay(Store),
    /// The worker, remembering every answer for the store.
    Record(Live, RefCell<Recording>),
}

/// Why no source could be opened.
pub enum OpenError {
    /// The reference cannot be reached live (and there is no usable store where that matters).
    Setup(WorkerError, Vec<String>),
    /// A configuration problem: no store, a stale or corrupt one, an invalid environment.
    Config(String),
}

/// Which store and which test a source serves: the kind of check.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// Suffix of the store's file name (`""`, `"__gradients"`).
    pub store_suffix: &'a str,
    /// The test function the attribute generates for it (`matches_reference`).
    pub test: &'a str,
    /// The check's description, as the store records it.
    pub description: &'a str,
}

fn record_hint(layer: &Layer, target: &Target<'_>) -> String {
    format!(
        "record it (needs Python with torch): {}",
        layer.rerun_command(target.test, "GOLDEN_MODE=record")
    )
}

/// Load the check's store and make sure it was recorded for this very description.
fn load_store(layer: &Layer, target: &Target<'_>) -> Result<Store, String> {
    let description = target.description;
    let path: PathBuf = store::path(layer, target.store_suffix).ok_or_else(|| {
        "replay needs a golden store, and this check is not declared with golden::declared!() \
         (the attribute does that), so it has none"
            .to_string()
    })?;
    let hint = || record_hint(layer, target);
    let store = Store::load(&path)
        .map_err(|e| format!("{e}; {}", hint()))?
        .ok_or_else(|| format!("there is no golden store at {}; {}", path.display(), hint()))?;
    if store.description != description {
        let (now, then) = description
            .lines()
            .zip(store.description.lines().chain(std::iter::repeat("")))
            .find(|(a, b)| a != b)
            .unwrap_or((description, &store.description));
        return Err(format!(
            "the golden store {} is out of date: it was recorded for `{then}`, the check now says \
             `{now}`; {}",
            path.display(),
            hint()
        ));
    }
    Ok(store)
}

impl Source {
    /// Open the source `mode` asks for. Also returns the worker's versions, when live.
    pub fn open(
        layer: &Layer,
        mode: Mode,
        target: &Target<'_>,
    ) -> Result<(Source, Json), OpenError> {
        if mode == Mode::Replay {
            return load_store(layer, target)
                .map(|s| (Source::Replay(s), Json::Null))
                .map_err(OpenError::Config);
        }
        let live = Live::new(layer).map_err(OpenError::Config)?;
        match live.load(layer) {
            Ok(versions) if mode == Mode::Record => {
                if store::path(layer, target.store_suffix).is_none() {
                    return Err(OpenError::Config(
                        "record needs to know where the store goes: declare the check with \
                         golden::declared!() (the attribute does that)"
                            .into(),
                    ));
                }
                Ok((Source::Record(live, RefCell::default()), versions))
            }
            Ok(versions) => Ok((Source::Live(live), versions)),
            Err(e) if mode == Mode::Auto => match load_store(layer, target) {
                Ok(store) => {
                    eprintln!(
                        "golden: `{}`: replaying {} (the reference is not reachable live: {})",
                        layer.name,
                        store.path.display(),
                        e.to_string().lines().next().unwrap_or_default()
                    );
                    Ok((Source::Replay(store), Json::Null))
                }
                Err(why) => Err(OpenError::Setup(
                    e,
                    vec![format!("no replay either: {why}")],
                )),
            },
            Err(e) => Err(OpenError::Setup(e, Vec::new())),
        }
    }

    /// The reference's answer to a request on one case.
    pub fn request(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
        request: &Request<'_>,
    ) -> Answer {
        let during = || format!("running `{}` on {params}", layer.reference);
        let answer = |r: Result<ReferenceOutputs, WorkerError>| match r {
            Ok(o) => Answer::Outputs(o),
            Err(e) => Answer::Failed(e),
        };
        match self {
            Source::Live(live) => {
                answer(live.request(layer, dtype, params.seed, request, &during()))
            }
            Source::Replay(store) => {
                match store.get(store::key(layer, dtype, params.seed, request)) {
                    Some(outputs) => Answer::Outputs(outputs.clone()),
                    None => Answer::Unrecorded,
                }
            }
            Source::Record(live, recording) => {
                let key = store::key(layer, dtype, params.seed, request);
                if let Some(&i) = recording.borrow().index.get(&key) {
                    return Answer::Outputs(recording.borrow().entries[i].outputs.clone());
                }
                let outputs = live.request(layer, dtype, params.seed, request, &during());
                if let Ok(o) = &outputs {
                    let mut r = recording.borrow_mut();
                    let at = r.entries.len();
                    r.index.insert(key, at);
                    r.entries.push(Entry {
                        key,
                        dtype,
                        case: params.to_string(),
                        outputs: o.clone(),
                    });
                    r.size += store::entry_size(&r.entries[at]);
                }
                answer(outputs)
            }
        }
    }

    /// The reference's known variants on a case; `None` in replay (they need Python).
    pub fn variants(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
    ) -> Option<Result<Vec<VariantOutputs>, WorkerError>> {
        match self {
            Source::Live(live) | Source::Record(live, _) => {
                Some(live.variants(layer, dtype, params.seed, args))
            }
            Source::Replay(_) => None,
        }
    }

    /// Record mode: whether everything recorded so far fits a store of `limit` bytes (its size
    /// bound) with this description. Other modes record nothing and always fit.
    pub fn recording_fits(&self, description: &str, limit: usize) -> bool {
        match self {
            Source::Record(_, recording) => {
                store::base_size(description) + recording.borrow().size <= limit
            }
            _ => true,
        }
    }

    /// Whether answers come from the store.
    pub fn is_replay(&self) -> bool {
        matches!(self, Source::Replay(_))
    }

    /// Write the store of a recording source; returns a line for the user.
    pub fn finish(&self, layer: &Layer, target: &Target<'_>) -> Result<Option<String>, String> {
        let Source::Record(_, recording) = self else {
            return Ok(None);
        };
        let path = store::path(layer, target.store_suffix).expect("checked when opened");
        let limit = store::limit_bytes()?;
        let entries = &recording.borrow().entries;
        let (kept, size) =
            store::save(&path, target.description, entries, limit).map_err(|e| e.to_string())?;
        let mut line = format!(
            "golden: `{}`: recorded {kept} cases in {} ({:.0} KiB)",
            layer.name,
            path.display(),
            size as f64 / 1024.0
        );
        if kept < entries.len() {
            line.push_str(&format!(
                "; {} more did not fit the {:.1} MiB bound (GOLDEN_STORE_LIMIT): a replay runs the \
                 recorded ones and does not compare the snapshot",
                entries.len() - kept,
                limit as f64 / (1024.0 * 1024.0)
            ));
        }
        Ok(Some(line))
    }
}
