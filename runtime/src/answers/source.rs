//! Where a check's reference outputs come from: the live Python worker, the golden store, or both.
//!
//! `GOLDEN_MODE` picks: `live` runs the reference and fails if it cannot; `replay` never starts
//! Python and answers from the store; `record` runs live and writes the store; `auto` (the default)
//! is live where the interpreter and the reference import, else replay, and says which it used;
//! `verify` runs live and fails where the store's answers differ.
//!
//! In module form the source also owns the reference module's parameters for each case
//! (`answers/params.rs`): drawn from the case seed with the module's [`ParamSpec`] (asked of the
//! worker once per distinct construction of the module — `init` and `config` values may depend on
//! the case's dims, and so may the module's shapes — or read from the store), or read from a
//! checkpoint; they go with every request and come back as the answer's state_dict, which the port
//! is served.
//!
//! A source also knows what the reference's answers are computed with ([`Provenance`]); where a
//! store's answers were computed with something else (another transformers, an edited reference),
//! [`Source::stale`] says so.

use crate::answers::checkpoint::{self, Resolved};
use crate::answers::live::{Live, Named, ReferenceOutputs, Request, State, VariantOutputs};
use crate::answers::params::{ParamSpec, StateDict};
use crate::answers::provenance::Provenance;
use crate::answers::store::{self, Entry, Store};
use crate::describe::env::Mode;
use crate::describe::inputs::CaseParams;
use crate::describe::layer::{Form, Layer, Params};
use crate::python::worker::{RemoteError, RemoteKind, WorkerError};
use candle_core::{DType, Device};
use golden_files::HostTensor;
use serde_json::Value as Json;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Module form: the parameters of a case, as the source holds them.
#[derive(Clone, Debug)]
pub enum ModuleState {
    /// Drawn by golden from the case seed: they travel with each request.
    Drawn(Named),
    /// A checkpoint's: the worker loads them once and keeps them by id.
    Checkpoint(Arc<Resolved>),
}

impl ModuleState {
    /// As a request carries it.
    pub fn as_state(&self) -> State<'_> {
        match self {
            ModuleState::Drawn(named) => State::Tensors(named),
            ModuleState::Checkpoint(resolved) => State::Checkpoint(resolved),
        }
    }
}

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

/// Cases evaluated live while recording, in order, up to the store's size bound: the first case
/// beyond it is kept too (the store records its size), later ones are counted only.
pub struct Recording {
    entries: Vec<Entry>,
    index: HashMap<u64, usize>,
    /// Their size as the store's bound counts it.
    size: usize,
    /// The bound for the entries (`GOLDEN_STORE_LIMIT` less what the store holds besides them).
    room: usize,
    /// Cases evaluated after the recording went past the bound: not kept.
    beyond: usize,
}

/// Where reference outputs come from.
pub enum Via {
    /// The Python worker.
    Live(Live),
    /// The golden store.
    Replay(Store),
    /// The worker, remembering every answer for the store.
    Record(Live, RefCell<Recording>),
    /// The worker, each answer checked against the store's.
    Verify(Live, Store),
}

/// A check's source of reference answers: where they come from, and the module's parameters.
pub struct Source {
    /// Where answers come from.
    pub via: Via,
    /// Module form, drawn or checkpoint parameters: the module's state_dict entries, per
    /// construction key ([`Layer::construction_key`]), in the order they were first needed.
    spec: RefCell<Vec<(String, ParamSpec)>>,
    /// Live: what the reference runs with, as the worker reported it.
    provenance: Option<Provenance>,
    /// Where a store's answers were computed with something else than what this machine has: a
    /// line for the user.
    stale: Option<String>,
    /// `weights = "..."`: the checkpoint resolved against the module's state_dict, per
    /// construction key.
    weights: RefCell<HashMap<String, Arc<Resolved>>>,
    /// The test function of the check, for the commands golden prints.
    test: String,
    /// A budgeted check (`budget = "60s"`): per dtype, how many cases its golden store says the
    /// budget held (every run but a recording keeps that count), then what this run's budget held.
    budgeted: RefCell<Vec<(DType, usize)>>,
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
        let source = |via: Via, provenance: Option<Provenance>| {
            let stale = match &via {
                Via::Replay(store) => replayed_stale(layer, store, &record_hint(layer, target)),
                Via::Verify(_, store) => store
                    .provenance
                    .as_ref()
                    .zip(provenance.as_ref())
                    .and_then(|(then, now)| {
                        stale_line(store, &then.differences(now), &record_hint(layer, target))
                    }),
                // Live beside a store: the store is what CI replays.
                Via::Live(_) => provenance.as_ref().and_then(|now| {
                    let store = Store::load(&store::path(layer, target.store_suffix)?).ok()??;
                    let then = store.provenance.as_ref()?;
                    stale_line(&store, &then.differences(now), &record_hint(layer, target))
                }),
                Via::Record(..) => None,
            };
            // What a budget held when the store was recorded: the count this run keeps (a
            // recording times its cases afresh).
            let budgeted = match &via {
                _ if layer.budget.is_none() => Vec::new(),
                Via::Replay(store) | Via::Verify(_, store) => store.budgeted.clone(),
                Via::Live(_) => store::path(layer, target.store_suffix)
                    .and_then(|p| Store::load(&p).ok().flatten())
                    .filter(|store| store.description == target.description)
                    .map_or(Vec::new(), |store| store.budgeted),
                Via::Record(..) => Vec::new(),
            };
            Source {
                via,
                spec: RefCell::new(Vec::new()),
                provenance,
                stale,
                weights: RefCell::new(HashMap::new()),
                test: target.test.to_string(),
                budgeted: RefCell::new(budgeted),
            }
        };
        if mode == Mode::Replay {
            return load_store(layer, target)
                .map(|s| (source(Via::Replay(s), None), Json::Null))
                .map_err(OpenError::Config);
        }
        let live = Live::new(layer).map_err(OpenError::Config)?;
        let loaded = live.load(layer).map(|versions| {
            let provenance = Provenance::from_json(&versions["provenance"]);
            (versions, provenance)
        });
        match loaded {
            Ok((versions, provenance)) if mode == Mode::Verify => {
                let store = load_store(layer, target).map_err(OpenError::Config)?;
                Ok((source(Via::Verify(live, store), provenance), versions))
            }
            Ok((versions, provenance)) if mode == Mode::Record => {
                if store::path(layer, target.store_suffix).is_none() {
                    return Err(OpenError::Config(
                        "record needs to know where the store goes: declare the check with \
                         golden::declared!() (the attribute does that)"
                            .into(),
                    ));
                }
                let limit = store::limit_bytes().map_err(OpenError::Config)?;
                let recording = Recording {
                    entries: Vec::new(),
                    index: HashMap::new(),
                    size: 0,
                    room: limit.saturating_sub(store::base_size(target.description)),
                    beyond: 0,
                };
                Ok((
                    source(Via::Record(live, RefCell::new(recording)), provenance),
                    versions,
                ))
            }
            Ok((versions, provenance)) => Ok((source(Via::Live(live), provenance), versions)),
            Err(e) if mode == Mode::Auto => match load_store(layer, target) {
                Ok(store) => {
                    eprintln!(
                        "golden: `{}`: replaying {} (the reference is not reachable live: {})",
                        layer.name,
                        store.path.display(),
                        e.to_string().lines().next().unwrap_or_default()
                    );
                    Ok((source(Via::Replay(store), None), Json::Null))
                }
                Err(why) => Err(OpenError::Setup(
                    e,
                    vec![format!("no replay either: {why}")],
                )),
            },
            Err(e) => Err(OpenError::Setup(e, Vec::new())),
        }
    }

    /// The module's parameter spec for `layer` as a case sees it ([`Layer::for_case`]): from the
    /// store when replaying, else asked of the worker once per construction key.
    fn spec(&self, layer: &Layer, dtype: DType) -> Result<ParamSpec, WorkerError> {
        let key = layer.construction_key();
        if let Some((_, spec)) = self.spec.borrow().iter().find(|(k, _)| *k == key) {
            return Ok(spec.clone());
        }
        let spec = match &self.via {
            Via::Replay(store) => store.params_for(&key).cloned().ok_or_else(|| {
                remote(
                    RemoteKind::Store,
                    format!(
                        "the golden store {} holds no parameter list for this module built with \
                         {key}; record it again",
                        store.path.display()
                    ),
                )
            })?,
            Via::Live(live) | Via::Record(live, _) | Via::Verify(live, _) => {
                live.param_spec(layer, dtype)?
            }
        };
        self.spec.borrow_mut().push((key, spec.clone()));
        Ok(spec)
    }

    /// The parameters a module-form case runs with, by the reference's names: drawn from the case
    /// seed, or the checkpoint's; `None` for the module's own init (and in function form).
    fn state(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
    ) -> Result<Option<(ModuleState, ParamSpec)>, WorkerError> {
        if layer.form != Form::Module || layer.params == Params::Init {
            return Ok(None);
        }
        let layer = &*params.layer(layer);
        let spec = self.spec(layer, dtype)?;
        let state = match &layer.params {
            Params::Weights(_) => ModuleState::Checkpoint(
                self.checkpoint(layer, &spec)
                    .map_err(|problems| remote(RemoteKind::Weights, problems.join("\n")))?,
            ),
            _ => ModuleState::Drawn(spec.draw(
                params.seed,
                dtype,
                layer.params == Params::DrawnAll,
                layer.param_scale(),
            )),
        };
        Ok(Some((state, spec)))
    }

    /// `weights = "..."`, checked before any case: the checkpoint mapped and hashed, and resolved
    /// against the module's state_dict (every missing entry and shape mismatch at once). `Ok` for
    /// any other check, and for a module whose construction depends on the case's dims (resolved
    /// per construction then). None of what it finds depends on a case: it is a configuration
    /// error, reported once and never shrunk.
    pub fn prepare(&self, layer: &Layer) -> Result<(), String> {
        if layer.form != Form::Module || !matches!(layer.params, Params::Weights(_)) {
            return Ok(());
        }
        if layer.values_mention_dims() {
            return Ok(());
        }
        let dtype = layer.dtypes.first().copied().unwrap_or(DType::F32);
        let spec = self.spec(layer, dtype).map_err(|e| e.to_string())?;
        self.checkpoint(layer, &spec)
            .map(|_| ())
            .map_err(|problems| problems.join("\n"))
    }

    /// `weights = "..."`: the checkpoint (mapped and hashed once per process) resolved against the
    /// module's state_dict, once per construction; every mismatch at once.
    fn checkpoint(&self, layer: &Layer, spec: &ParamSpec) -> Result<Arc<Resolved>, Vec<String>> {
        let key = layer.construction_key();
        if let Some(found) = self.weights.borrow().get(&key) {
            return Ok(Arc::clone(found));
        }
        let path = layer.weights_path().expect("weights were declared");
        let file = checkpoint::open(&path).map_err(|e| vec![e])?;
        let resolved = Arc::new(file.resolve(spec, &layer.rename)?);
        checkpoint::register(&resolved);
        self.weights.borrow_mut().insert(key, Arc::clone(&resolved));
        Ok(resolved)
    }

    /// The error that stops the check when a checkpoint it reads changed on disk since it was
    /// hashed ([`checkpoint::changed_error`]); `None` while every one is the file it was.
    pub fn checkpoint_changed(&self) -> Option<WorkerError> {
        self.weights.borrow().values().find_map(|resolved| {
            let what = resolved.checkpoint.changed()?;
            Some(checkpoint::changed_error(&resolved.checkpoint, &what, None))
        })
    }

    /// The parameters a module-form case runs with, by the reference's names (drawn from the case
    /// seed, or a checkpoint's); `None` for the module's own init and in function form. Requests
    /// made outside [`Source::request`] (the mutation diagnosis) send these.
    pub fn module_state(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
    ) -> Result<Option<ModuleState>, WorkerError> {
        Ok(self.state(layer, dtype, params)?.map(|(state, _)| state))
    }

    /// The reference's answer to a request on one case.
    pub fn request(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
        request: &Request<'_>,
    ) -> Answer {
        let layer = &*params.layer(layer);
        let during = || format!("running `{}` on {params}", layer.reference);
        let state = match self.state(layer, dtype, params) {
            Ok(s) => s,
            Err(e) => return Answer::Failed(e),
        };
        let (tensors, spec) = match &state {
            Some((t, s)) => (Some(t.as_state()), Some(s)),
            None => (None, None),
        };
        let key = || store::key(layer, dtype, params.seed, request, tensors);
        let ask =
            |live: &Live| live.request(layer, dtype, params.seed, request, tensors, &during());
        let answer = match &self.via {
            Via::Live(live) => ask(live),
            Via::Replay(store) => match store.get(key()) {
                Some(outputs) => Ok(outputs.clone()),
                None => return Answer::Unrecorded,
            },
            // Evaluating twice asks the live reference again, recorded or not.
            Via::Record(live, _) if matches!(request, Request::Forward { twice: true, .. }) => {
                ask(live)
            }
            Via::Record(live, recording) => {
                let key = key();
                let recorded = recording.borrow().index.get(&key).copied();
                match recorded {
                    Some(i) => Ok(recording.borrow().entries[i].outputs.clone()),
                    None => {
                        let outputs = ask(live);
                        let mut r = recording.borrow_mut();
                        if outputs.is_ok() && r.size > r.room {
                            // Past the bound: the store keeps none of it (nor does memory).
                            r.beyond += 1;
                        } else if let Ok(o) = &outputs {
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
                        outputs
                    }
                }
            }
            // A case the store has not recorded is treated as in replay (check.rs: a shrink
            // candidate passes, a generated case means the store is out of date).
            Via::Verify(_, store) if store.get(key()).is_none() => return Answer::Unrecorded,
            Via::Verify(live, store) => ask(live).and_then(|outputs| {
                match store.get(key()) {
                    None => unreachable!("checked above"),
                    Some(recorded) => match store::disagreement(layer, recorded, &outputs) {
                        Some(why) => Err(remote(
                            RemoteKind::Store,
                            format!(
                                "the golden store {} disagrees with the live reference: {why}; \
                                 a store is trusted to replay what the reference answered when it \
                                 was recorded, so it was recorded with another reference or edited: \
                                 {}",
                                store.path.display(),
                                layer.rerun_command(&self.test, "GOLDEN_MODE=record")
                            ),
                        )),
                        None => Ok(outputs),
                    },
                }
            }),
        };
        // A checkpoint written over while the reference read it: its answer (or its death) is
        // the file's doing, and the port must not read the file again.
        if let Some((ModuleState::Checkpoint(resolved), _)) = &state {
            if let Some(what) = resolved.checkpoint.changed() {
                return Answer::Failed(checkpoint::changed_error(
                    &resolved.checkpoint,
                    &what,
                    answer.as_ref().err(),
                ));
            }
        }
        match answer {
            Ok(mut outputs) => {
                if let (Some((state, _)), Some(spec)) = (&state, spec) {
                    match state {
                        ModuleState::Drawn(named) => outputs.state_dict = named.clone(),
                        ModuleState::Checkpoint(resolved) => {
                            outputs.state_dict = (*resolved.named()).clone();
                            outputs.state_id = Some(resolved.id);
                        }
                    }
                    outputs.aliases = spec.aliases.clone();
                    outputs.unsaved = spec.unsaved.clone();
                    outputs.buffers = spec
                        .entries
                        .iter()
                        .filter(|e| e.buffer)
                        .map(|e| e.name.clone())
                        .collect();
                    outputs.kept = if layer.params == Params::DrawnAll {
                        Vec::new()
                    } else {
                        spec.entries
                            .iter()
                            .filter(|e| e.may_go_unread())
                            .map(|e| e.name.clone())
                            .collect()
                    };
                }
                Answer::Outputs(outputs)
            }
            Err(e) => Answer::Failed(e),
        }
    }

    /// What the snapshot says about the module's parameters beyond the description: those kept as
    /// the module has them, those drawn fresh because it leaves them uninitialised (every
    /// construction's, once each).
    pub fn param_notes(&self, layer: &Layer) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, spec) in self.spec.borrow().iter() {
            for note in spec.notes(layer.params == Params::DrawnAll) {
                if !out.contains(&note) {
                    out.push(note);
                }
            }
        }
        out
    }

    /// The reference's known variants on a case; `None` in replay (they need Python).
    pub fn variants(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
    ) -> Option<Result<Vec<VariantOutputs>, WorkerError>> {
        let live = self.live()?;
        let plan = params.plan(layer);
        let layer = &*params.layer(layer);
        let state = match self.state(layer, dtype, params) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        Some(live.variants(
            layer,
            dtype,
            params.seed,
            args,
            state.as_ref().map(|s| s.0.as_state()),
            plan.as_ref(),
        ))
    }

    /// The live reference, unless this is a replay.
    pub fn live(&self) -> Option<&Live> {
        match &self.via {
            Via::Live(live) | Via::Record(live, _) | Via::Verify(live, _) => Some(live),
            Via::Replay(_) => None,
        }
    }

    /// Record mode: whether everything recorded so far fits a store of `limit` bytes (its size
    /// bound) with this description. Other modes record nothing and always fit.
    pub fn recording_fits(&self) -> bool {
        match &self.via {
            Via::Record(_, recording) => {
                let r = recording.borrow();
                r.size <= r.room
            }
            _ => true,
        }
    }

    /// Where the store's answers were computed with something else than what this machine has
    /// (another transformers, an edited reference): a line that says so and how to refresh it.
    pub fn stale(&self) -> Option<&str> {
        self.stale.as_deref()
    }

    /// A budgeted check's number of cases in `dtype` when it is already fixed: the count its
    /// golden store recorded, or the one this run's budget held (a recording's first pass).
    pub fn budgeted_cases(&self, dtype: DType) -> Option<usize> {
        self.budgeted
            .borrow()
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, n)| *n)
    }

    /// Keep `n` as the number of cases the budget held in `dtype` (a recording writes it into the
    /// store).
    pub fn hold_budgeted(&self, dtype: DType, n: usize) {
        let mut held = self.budgeted.borrow_mut();
        held.retain(|(d, _)| *d != dtype);
        held.push((dtype, n));
    }

    /// Whether answers come from the store.
    pub fn is_replay(&self) -> bool {
        matches!(self.via, Via::Replay(_))
    }

    /// Write the store of a recording source; returns a line for the user.
    pub fn finish(&self, layer: &Layer, target: &Target<'_>) -> Result<Option<String>, String> {
        let Via::Record(_, recording) = &self.via else {
            return Ok(None);
        };
        let path = store::path(layer, target.store_suffix).expect("checked when opened");
        let limit = store::limit_bytes()?;
        let recording = recording.borrow();
        let entries = &recording.entries;
        // One parameter list needs no key (every case is built alike): the store reads as before.
        let specs: Vec<(Option<String>, ParamSpec)> = match &self.spec.borrow()[..] {
            [(_, one)] if !layer.values_vary() => vec![(None, one.clone())],
            all => all
                .iter()
                .map(|(k, s)| (Some(k.clone()), s.clone()))
                .collect(),
        };
        let (kept, size) = store::save_budgeted(
            &path,
            target.description,
            &specs,
            self.provenance.as_ref(),
            entries,
            limit,
            recording.beyond,
            &self.budgeted.borrow(),
        )
        .map_err(|e| e.to_string())?;
        // A whole model's staged evaluation records one answer per stage of each case.
        let cases = |entries: &[Entry]| {
            let mut seen: Vec<(DType, &str)> =
                entries.iter().map(|e| (e.dtype, e.case.as_str())).collect();
            seen.sort_unstable_by(|a, b| (a.0.as_str(), a.1).cmp(&(b.0.as_str(), b.1)));
            seen.dedup();
            seen.len()
        };
        let recorded = cases(&entries[..kept]);
        let answers = if recorded < kept {
            format!(" ({kept} answers: a stage of a whole model's evaluation each)")
        } else {
            String::new()
        };
        let evaluated = entries.len() + recording.beyond;
        let size = crate::describe::numbers::bytes(size as u128);
        if kept == evaluated {
            return Ok(Some(format!(
                "golden: `{}`: recorded {recorded} cases{answers} in {} ({size})",
                layer.name,
                path.display()
            )));
        }
        Ok(Some(format!(
            "golden: `{}`: recorded {recorded} of the {} cases it evaluated{answers} in {} \
             ({size}), the others beyond its size bound ({}, GOLDEN_STORE_LIMIT): a replay runs \
             those {recorded} and, instead of comparing the snapshot's figures, checks the store's \
             SHA-256 against the one the snapshot records (its store lines say the store is \
             partial)",
            layer.name,
            cases(entries) + recording.beyond,
            path.display(),
            crate::describe::numbers::bytes(limit as u128)
        )))
    }
}

/// Module form: the parameters the port is served for a case, from the reference's answer (a
/// checkpoint's shared once per process); `None` in function form.
pub(crate) fn port_state(
    layer: &Layer,
    dtype: DType,
    reference: &ReferenceOutputs,
    device: &Device,
) -> candle_core::Result<Option<StateDict>> {
    let state = match (layer.form, reference.state_id) {
        (Form::Module, Some(id)) => {
            // One copy of the checkpoint's weights, shared by every case's port.
            let resolved = crate::answers::checkpoint::resolved(id).ok_or_else(|| {
                candle_core::Error::Msg(format!("no checkpoint of id {id:016x} is open"))
            })?;
            Some(StateDict::shared(
                resolved.port_tensors(dtype)?,
                &reference.state_dict,
                &reference.aliases,
                &layer.rename,
                dtype,
                device,
            )?)
        }
        (Form::Module, None) => Some(StateDict::serve(
            &reference.state_dict,
            &reference.aliases,
            &layer.rename,
            dtype,
            device,
        )?),
        (Form::Function, None | Some(_)) => None,
    };
    if let Some(state) = &state {
        state.not_in_checkpoints(&reference.unsaved);
    }
    Ok(state)
}

/// The line that says a store's answers are stale evidence, if `differences` has any.
fn stale_line(store: &Store, differences: &[String], hint: &str) -> Option<String> {
    if differences.is_empty() {
        return None;
    }
    Some(format!(
        "warning: the golden store {} was recorded with {}: its answers may not be what the \
         reference gives now; {hint}",
        store.path.display(),
        differences.join(", ")
    ))
}

/// A replay's staleness, seen without Python: the packages and source files the store records,
/// as the interpreter golden would run has them.
fn replayed_stale(layer: &Layer, store: &Store, hint: &str) -> Option<String> {
    let then = store.provenance.as_ref()?;
    let key = crate::python::key::WorkerKey::from_env(layer.manifest_dir());
    let now = then.observed(&key.python.program, &key.roots);
    stale_line(store, &then.differences(&now), hint)
}

/// An error the reference side reports for a case (not the worker's own failure).
fn remote(kind: RemoteKind, message: String) -> WorkerError {
    WorkerError::Remote(RemoteError {
        kind,
        message,
        traceback: None,
        phase: None,
    })
}
