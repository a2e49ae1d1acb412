//! The golden store: a check's recorded reference outputs, replayable with no Python at all.
//!
//! `GOLDEN_MODE=record` runs the reference live and writes, beside the check's snapshot,
//! `<snapshot dir>/<check>.golden`: for every case it evaluated, the reference's outputs in the case
//! dtype and their rounding estimate (with `params = init`, the module's state_dict too) — keyed by
//! a hash of the reference, its options, the dtype, the case seed and the exact input (and
//! parameter) bytes. In module form with drawn or checkpoint parameters the store holds the
//! module's parameter list ([`ParamSpec`]) once per distinct construction of the module (one,
//! unless `init` or `config` values depend on the case's dims): a replay draws the same parameters
//! from it. `replay` regenerates the inputs from the seed and looks the outputs up.
//!
//! It also records what the answers were computed with ([`Provenance`]: Python, numpy, torch,
//! the reference's distribution such as transformers, and the SHA-256 of the reference's source
//! files), so that a replay on a machine with other versions, or of a reference edited since,
//! says that its evidence may be stale.
//!
//! What a store is trusted for: to replay what the reference answered when it was recorded. The
//! checksum catches damage, not intent; [`digest`] (SHA-256 of the file) goes into the check's
//! snapshot, so a store that changes without its snapshot fails in review and in CI, and
//! `GOLDEN_MODE=verify` compares a store with the live reference.
//!
//! ```text
//! 8 bytes   b"GOLDSTOR"
//! u32 LE    format version (3; format 2, with one parameter list and no provenance, is read too)
//! u64 LE    FNV-1a 64 of everything after this field
//! ...       one wire frame (wire.rs): a JSON header and the tensors it refers to, bf16 kept
//! ```
//!
//! Names in a store (outputs, rounding estimates, state_dict entries, buffers) become file names when
//! a replayed failure writes its artifacts; a name that could lead outside golden's folders (`/`,
//! `\`, `..`, NUL, an absolute path) is refused when a store is written and makes a store corrupt
//! when it is read ([`unsafe_name`]).
//!
//! Byte-for-byte deterministic: entries in the order the cases ran, JSON with sorted keys. A store is
//! bounded (`GOLDEN_STORE_LIMIT` MiB, default 4): when a check's cases would exceed it, the cases
//! that fit are kept and the store is marked partial; a replay then runs those cases only and does
//! not compare the snapshot, which describes all of them (record runs every declared case live, so
//! that it does), but checks the store's SHA-256 against the one the snapshot records, whose store
//! lines say the store is partial ([`Stamp::partial`]).

use crate::answers::live::{Named, ReferenceOutputs, Request, State, Unexplained};
use crate::answers::params::ParamSpec;
use crate::answers::provenance::Provenance;
use crate::describe::inputs::fnv1a;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::python::wire::{self, Frame, TensorTable};
use candle_core::DType;
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"GOLDSTOR";
const FORMAT: u32 = 3;
/// The older format still read: one parameter list for every case, no provenance.
const FORMAT_2: u32 = 2;
const PREAMBLE: usize = 8 + 4 + 8;
/// Default size bound of one store, in MiB.
pub const DEFAULT_LIMIT_MIB: f64 = 4.0;

/// One recorded case.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Hash of reference, options, dtype, seed and input bytes ([`key`]).
    pub key: u64,
    /// The case dtype.
    pub dtype: DType,
    /// The case, as printed in reports (for people reading the store).
    pub case: String,
    /// What the reference produced.
    pub outputs: ReferenceOutputs,
}

/// A loaded store.
#[derive(Debug)]
pub struct Store {
    /// Where it was read from.
    pub path: PathBuf,
    /// The description of the check it was recorded for ([`Layer::description`]).
    pub description: String,
    /// `Some((kept, evaluated))` when the size bound dropped cases.
    pub partial: Option<(usize, usize)>,
    /// A partial store: the size bound it was cut at and the size of the first case it dropped,
    /// both as the bound counts them (what makes a claim to be partial checkable).
    pub cut: Option<(usize, usize)>,
    /// Module form with drawn or checkpoint parameters: the module's parameter list for each
    /// construction ([`Layer::construction_key`]); a format-2 store's one list has no key and
    /// serves every case.
    pub params: Vec<(Option<String>, ParamSpec)>,
    /// What the answers were computed with (`None` in a format-2 store).
    pub provenance: Option<Provenance>,
    /// A budgeted check's (`budget = "60s"`): per dtype, how many cases its budget held when it
    /// was recorded, the count every run of it keeps.
    pub budgeted: Vec<(DType, usize)>,
    entries: Vec<Entry>,
    index: HashMap<u64, usize>,
}

/// Why a store cannot be used.
#[derive(Debug)]
pub enum StoreError {
    /// Reading or writing failed.
    Io(PathBuf, std::io::Error),
    /// The file is not a valid store (truncated, wrong checksum, malformed).
    Corrupt(PathBuf, String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Io(p, e) => write!(f, "golden store {}: {e}", p.display()),
            StoreError::Corrupt(p, why) => write!(
                f,
                "golden store {} is corrupt ({why}); it is never trusted in that state: restore it \
                 from version control or record it again",
                p.display()
            ),
        }
    }
}

impl std::error::Error for StoreError {}

/// The size bound: `GOLDEN_STORE_LIMIT` MiB, default 4.
pub fn limit_bytes() -> Result<usize, String> {
    let mib = crate::describe::env::store_limit_mib(DEFAULT_LIMIT_MIB)?;
    Ok((mib * 1024.0 * 1024.0) as usize)
}

/// Where a check's store lives: `<snapshot dir>/<check><suffix>.golden` (None when not declared).
/// The suffix tells the stores of one layer's checks apart (`__gradients`).
pub fn path(layer: &Layer, suffix: &str) -> Option<PathBuf> {
    let declared = layer.declared?;
    Some(Path::new(declared.snapshot_dir).join(format!("{}{suffix}.golden", layer.check_name())))
}

/// The key of a request: a hash of everything the reference's answer depends on (with `state`,
/// the module's parameters the request carries: drawn tensors byte by byte, a checkpoint by its
/// state's id, which holds the file's content hash, computed once per process). `layer` as the
/// case sees it ([`Layer::for_case`]): values that depend on dims resolved.
pub fn key(
    layer: &Layer,
    dtype: DType,
    seed: u64,
    request: &Request<'_>,
    state: Option<State<'_>>,
) -> u64 {
    let json = |v: &[(String, crate::describe::layer::Value)]| {
        serde_json::to_string(&v.iter().map(|(k, v)| (k, v.to_json())).collect::<Vec<_>>())
            .expect("JSON")
    };
    let (what, tensors) = request.key_parts();
    let mut bytes = Vec::new();
    let consts = json(&layer.consts);
    let init = json(&layer.init);
    let config = layer
        .config
        .as_ref()
        .map(|c| c.to_json().to_string())
        .unwrap_or_default();
    let mut parts = vec![
        layer.reference.as_str(),
        layer.form.as_str(),
        layer.backend.as_str(),
        &consts,
        &init,
        dtype_name(dtype),
    ];
    // A module without a configuration class keeps the keys it had before there were any.
    if layer.config.is_some() {
        parts.push(&config);
    }
    // Forward requests add nothing: their keys stay what they were before other kinds existed.
    if !what.is_empty() {
        parts.push(&what);
    }
    for part in parts {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    bytes.extend_from_slice(&seed.to_le_bytes());
    let (drawn, checkpoint) = match state {
        Some(State::Tensors(named)) => (Some(named), None),
        Some(State::Checkpoint(resolved)) => (None, Some(resolved.id)),
        None => (None, None),
    };
    let state = drawn.into_iter().flatten().map(|(_, t)| t);
    for a in tensors.into_iter().chain(state) {
        bytes.push(a.dtype.code());
        for &d in &a.shape {
            bytes.extend_from_slice(&(d as u64).to_le_bytes());
        }
        bytes.push(0xff);
        bytes.extend_from_slice(&a.data);
    }
    if let Some(id) = checkpoint {
        bytes.extend_from_slice(b"checkpoint\0");
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    fnv1a(&bytes)
}

fn named_json(named: &Named, table: &mut TensorTable) -> Json {
    Json::Array(
        named
            .iter()
            .map(|(n, t)| json!([n, table.add(t.clone())]))
            .collect(),
    )
}

/// What an entry adds to a store's size, as the size bound counts it.
pub(crate) fn entry_size(e: &Entry) -> usize {
    let tensors = |n: &Named| {
        n.iter()
            .map(|(name, t)| t.data.len() + 40 + name.len())
            .sum::<usize>()
    };
    200 + e.case.len()
        + tensors(&e.outputs.expected)
        + tensors(&e.outputs.state_dict)
        + e.outputs.rounding.as_ref().map_or(0, tensors)
        + e.outputs.precise.as_ref().map_or(0, tensors)
}

fn unexplained_json(u: &Unexplained) -> Json {
    let mut j = json!({
        "leaf": u.leaf, "count": u.count, "index": u.index,
        "case_value": u.case_value, "float64_value": u.float64_value,
    });
    // Left out when false: stores recorded before it existed keep their bytes.
    if let Some(kind) = u.kind.name() {
        j["kind"] = json!(kind);
        j["error"] = json!(u.error);
    }
    j
}

fn unexplained_of(v: &Json) -> Result<Unexplained, String> {
    Ok(Unexplained {
        leaf: v["leaf"]
            .as_str()
            .ok_or("`unexplained` without a leaf")?
            .to_string(),
        count: v["count"].as_u64().unwrap_or(0) as usize,
        index: v["index"]
            .as_array()
            .map(|i| {
                i.iter()
                    .filter_map(|x| x.as_u64().map(|x| x as usize))
                    .collect()
            })
            .unwrap_or_default(),
        // JSON has no infinity or NaN: a value that is not a number was not finite.
        case_value: v["case_value"].as_f64().unwrap_or(f64::NAN),
        float64_value: v["float64_value"].as_f64().unwrap_or(f64::INFINITY),
        kind: crate::answers::live::UnexplainedKind::from_name(v["kind"].as_str()),
        error: v["error"].as_f64().unwrap_or(0.0),
    })
}

/// How a recorded answer and a live one differ beyond the comparison's tolerance (the recorded one
/// judged as the reference, with its rounding estimate), or `None` when they agree.
pub fn disagreement(
    layer: &Layer,
    recorded: &ReferenceOutputs,
    live: &ReferenceOutputs,
) -> Option<String> {
    let leaves = recorded.compare(
        &live.expected,
        layer.tol,
        crate::judge::compare::ROUNDING_FACTOR,
    );
    let bad = leaves.iter().find(|l| !l.passes())?;
    Some(match &bad.verdict {
        crate::judge::compare::Verdict::Values(v) => match &v.worst {
            Some(e) => format!(
                "leaf `{}` is {} in the store and {} live at {:?} (allowed {})",
                bad.name,
                crate::describe::numbers::num(e.reference),
                crate::describe::numbers::num(e.port),
                e.index,
                crate::describe::numbers::num(e.allowed)
            ),
            None => format!("leaf `{}` differs", bad.name),
        },
        crate::judge::compare::Verdict::MissingInPort => {
            format!(
                "leaf `{}` is in the store, not in the live answer",
                bad.name
            )
        }
        crate::judge::compare::Verdict::MissingInReference => {
            format!(
                "leaf `{}` is in the live answer, not in the store",
                bad.name
            )
        }
        _ => format!(
            "leaf `{}` has another shape or dtype in the store ({:?}) than live ({:?})",
            bad.name, bad.reference, bad.port
        ),
    })
}

/// SHA-256 of a store file, in hex (`None` when there is no file): what a check's snapshot records,
/// so that a store that changes without its snapshot shows in review and fails in CI.
pub fn digest(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(crate::answers::provenance::sha256(&bytes))
}

/// What a check's snapshot says of its golden store: the file's SHA-256 and what its answers were
/// computed with, so that a pull request that re-records a store shows why its bytes changed
/// (`transformers 5.22.0` → `5.23.0`, a reference source edited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// SHA-256 of the file, in hex.
    pub sha256: String,
    /// What it was recorded with (`None` for a format-2 store, or one that cannot be decoded: its
    /// digest is still recorded, and a replay reports the damage).
    pub provenance: Option<Provenance>,
    /// A partial store: the cases it holds, the cases recording evaluated, and the size bound that
    /// dropped the others (`GOLDEN_STORE_LIMIT`, in bytes).
    pub partial: Option<(usize, usize, usize)>,
}

/// The [`Stamp`] of the store at `path`; `None` when there is no file.
pub fn stamp(path: &Path) -> Option<Stamp> {
    let bytes = std::fs::read(path).ok()?;
    let sha256 = crate::answers::provenance::sha256(&bytes);
    let store = Store::decode(path, bytes).ok();
    let partial = store.as_ref().and_then(|s| {
        let (kept, evaluated) = s.partial?;
        Some((kept, evaluated, s.cut?.0))
    });
    let provenance = store.and_then(|s| s.provenance);
    Some(Stamp {
        sha256,
        provenance,
        partial,
    })
}

/// Why `name` may not be in a store: it could name a file outside golden's folders where a failure
/// writes its artifacts. `None` for a name a store may hold.
pub fn unsafe_name(name: &str) -> Option<&'static str> {
    if name.starts_with(['/', '\\']) || Path::new(name).is_absolute() {
        Some("is an absolute path")
    } else if name.contains("..") {
        Some("contains `..`")
    } else if name.contains(['/', '\\']) {
        Some("contains a path separator")
    } else if name.contains('\0') {
        Some("contains a NUL character")
    } else {
        None
    }
}

/// The first name of an entry a store may not hold, said as an error.
fn check_names(e: &Entry) -> Result<(), String> {
    let o = &e.outputs;
    let lists: [(&str, Vec<&String>); 4] = [
        ("output", o.expected.iter().map(|(n, _)| n).collect()),
        (
            "rounding estimate",
            o.rounding.iter().flatten().map(|(n, _)| n).collect(),
        ),
        (
            "state_dict entry",
            o.state_dict.iter().map(|(n, _)| n).collect(),
        ),
        ("buffer", o.buffers.iter().collect()),
    ];
    for (what, names) in lists {
        for name in names {
            if let Some(why) = unsafe_name(name) {
                return Err(format!(
                    "the {what} name {name:?} {why}: a store never holds a name that could lead a \
                     file outside golden's folders"
                ));
            }
        }
    }
    Ok(())
}

/// What a store's header says of its cases, against what it holds: every case it says it kept, at
/// least one, and — for a store that says its size bound dropped cases — a bound that the kept
/// cases and the first dropped one really exceed. The header is inside the data it vouches for, so
/// this only refuses a claim that contradicts the store; the SHA-256 its snapshot records (checked
/// whatever the header says, `run/check.rs`) is what makes it tamper-evident. Returns the bound and
/// the dropped case's size of a partial store.
fn check_cases(
    description: &str,
    entries: &[Entry],
    kept: usize,
    evaluated: usize,
    cases: &Json,
) -> Result<Option<(usize, usize)>, String> {
    if entries.is_empty() {
        return Err(format!(
            "it holds no case (its header says {kept} of {evaluated} kept): a store that would \
             compare nothing is never trusted"
        ));
    }
    if kept != entries.len() {
        return Err(format!(
            "its header says {kept} cases were kept, it holds {}",
            entries.len()
        ));
    }
    if kept >= evaluated {
        return Ok(None);
    }
    let size = base_size(description) + entries.iter().map(entry_size).sum::<usize>();
    let claim = format!("it says it is partial ({kept} of {evaluated} cases kept)");
    let bound = cases["bound"].as_u64().map(|b| b as usize);
    let next = cases["next"].as_u64().map(|n| n as usize);
    match (bound, next) {
        (Some(bound), Some(next)) if size + next > bound && size <= bound => {
            Ok(Some((bound, next)))
        }
        (Some(bound), Some(next)) => Err(format!(
            "{claim}, but its {} cases and the first dropped one ({}) fit the size bound it \
             records ({}): a partial store far below its bound is never trusted; record it again",
            kept,
            crate::describe::numbers::bytes(next as u128),
            crate::describe::numbers::bytes(bound as u128)
        )),
        _ => Err(format!(
            "{claim}, but it does not record the size bound that dropped the others ({}); \
             record it again",
            crate::describe::numbers::bytes(size as u128)
        )),
    }
}

/// What a store's size bound counts before its entries.
pub(crate) fn base_size(description: &str) -> usize {
    1024 + description.len()
}

/// Write a store; returns how many entries were kept and the file's size. `params`: the module's
/// parameter list per construction key (none in function form or with `params = init`). The
/// entries that fit `limit` are kept; `beyond` counts the cases evaluated after `entries`, which a
/// recording no longer keeps once it is past the bound (the header's count of evaluated cases).
pub fn save(
    path: &Path,
    description: &str,
    params: &[(Option<String>, ParamSpec)],
    provenance: Option<&Provenance>,
    entries: &[Entry],
    limit: usize,
    beyond: usize,
) -> Result<(usize, usize), StoreError> {
    save_budgeted(
        path,
        description,
        params,
        provenance,
        entries,
        limit,
        beyond,
        &[],
    )
}

/// [`save`] a budgeted check's store (`budget = "60s"`): `budgeted` is, per dtype, how many cases
/// the budget held, which runs after it keep ([`Store::budgeted`]).
#[allow(clippy::too_many_arguments)]
pub fn save_budgeted(
    path: &Path,
    description: &str,
    params: &[(Option<String>, ParamSpec)],
    provenance: Option<&Provenance>,
    entries: &[Entry],
    limit: usize,
    beyond: usize,
    budgeted: &[(DType, usize)],
) -> Result<(usize, usize), StoreError> {
    for (i, e) in entries.iter().enumerate() {
        check_names(e).map_err(|why| {
            let why = format!(
                "cannot record case {} ({}): {why}; rename it in the reference (a dict key, a \
                 parameter or submodule name)",
                i + 1,
                e.case
            );
            StoreError::Io(
                path.to_path_buf(),
                std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            )
        })?;
    }
    let mut kept = 0;
    let mut size = base_size(description);
    for e in entries {
        size += entry_size(e);
        if size > limit {
            break;
        }
        kept += 1;
    }
    let mut table = TensorTable::default();
    let items: Vec<Json> = entries[..kept]
        .iter()
        .map(|e| {
            let o = &e.outputs;
            let mut item = json!({
                "key": format!("{:016x}", e.key),
                "dtype": dtype_name(e.dtype),
                "case": e.case,
                "expected": named_json(&o.expected, &mut table),
                "rounding": o.rounding.as_ref().map(|r| named_json(r, &mut table)),
                "precise_error": o.precise_error,
            });
            // What most entries lack is left out rather than written empty.
            let fields = item.as_object_mut().expect("an object");
            if !o.state_dict.is_empty() {
                fields.insert("state_dict".into(), named_json(&o.state_dict, &mut table));
            }
            if let Some(p) = &o.precise {
                fields.insert("precise".into(), named_json(p, &mut table));
            }
            for (key, list) in [
                ("buffers", &o.buffers),
                ("unsaved", &o.unsaved),
                ("mutated", &o.mutated),
            ] {
                if !list.is_empty() {
                    fields.insert(key.into(), json!(list));
                }
            }
            if !o.aliases.is_empty() {
                fields.insert("aliases".into(), json!(o.aliases));
            }
            if !o.unexplained.is_empty() {
                let u: Vec<Json> = o.unexplained.iter().map(unexplained_json).collect();
                fields.insert("unexplained".into(), Json::Array(u));
            }
            item
        })
        .collect();
    let mut header = json!({
        "golden_store": FORMAT,
        "description": description,
        "cases": {"kept": kept, "evaluated": entries.len() + beyond},
        "entries": items,
    });
    if kept < entries.len() {
        // What makes the claim to be partial checkable when the store is read: the bound, and
        // the size of the first case that did not fit under it.
        header["cases"]["bound"] = json!(limit);
        header["cases"]["next"] = json!(entry_size(&entries[kept]));
    }
    if !params.is_empty() {
        header["params"] = Json::Array(
            params
                .iter()
                .map(|(key, spec)| json!({"construction": key, "spec": spec.to_json(&mut table)}))
                .collect(),
        );
    }
    if let Some(p) = provenance {
        header["recorded_with"] = p.to_json();
    }
    if !budgeted.is_empty() {
        header["budgeted"] = Json::Object(
            budgeted
                .iter()
                .map(|(d, n)| (dtype_name(*d).to_string(), json!(n)))
                .collect(),
        );
    }
    let frame = wire::encode(&Frame {
        id: 0,
        header,
        tensors: table.tensors,
    });
    let out = seal(&frame);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(dir.to_path_buf(), e))?;
    }
    // Write beside and rename: a reader never sees half a store.
    let tmp = path.with_extension("golden.tmp");
    std::fs::write(&tmp, &out).map_err(|e| StoreError::Io(tmp.clone(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| StoreError::Io(path.to_path_buf(), e))?;
    Ok((kept, out.len()))
}

/// A store's bytes around an encoded frame: magic, format and checksum. Public for the fuzz
/// target, which must get past the checksum to reach the decoder behind it.
pub fn seal(frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREAMBLE + frame.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&fnv1a(frame).to_le_bytes());
    out.extend_from_slice(frame);
    out
}

fn parse_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => return None,
    })
}

impl Store {
    /// Read and verify a store; `Ok(None)` when there is no file.
    pub fn load(path: &Path) -> Result<Option<Store>, StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::Io(path.to_path_buf(), e)),
        };
        Self::decode(path, bytes).map(Some)
    }

    /// Verify and decode a store's bytes.
    pub fn decode(path: &Path, bytes: Vec<u8>) -> Result<Store, StoreError> {
        let corrupt = |why: String| StoreError::Corrupt(path.to_path_buf(), why);
        if bytes.len() < PREAMBLE || &bytes[..8] != MAGIC {
            return Err(corrupt(
                "not a golden store: bad magic or truncated header".into(),
            ));
        }
        let format = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if format != FORMAT && format != FORMAT_2 {
            return Err(corrupt(format!(
                "format {format}, this golden reads formats {FORMAT_2} and {FORMAT}"
            )));
        }
        let checksum = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
        let mut body: bytes::Bytes = bytes.into();
        let frame_bytes = body.split_off(PREAMBLE);
        if fnv1a(&frame_bytes) != checksum {
            return Err(corrupt("checksum mismatch: truncated or modified".into()));
        }
        let mut reader = &frame_bytes[..];
        let frame = wire::read_frame(&mut reader).map_err(|e| corrupt(e.to_string()))?;
        if !reader.is_empty() {
            return Err(corrupt(format!("{} bytes after the frame", reader.len())));
        }
        Self::from_frame(path, format, frame).map_err(corrupt)
    }

    fn from_frame(path: &Path, format: u32, frame: Frame) -> Result<Store, String> {
        let h = &frame.header;
        let t = &frame.tensors;
        let named = |v: &Json| -> Result<Named, String> {
            v.as_array()
                .ok_or("expected a list of [name, tensor]")?
                .iter()
                .map(|item| {
                    let name = item[0].as_str().ok_or("a leaf without a name")?;
                    let tensor = wire::tensor_ref(&item[1], t).map_err(|e| e.to_string())?;
                    Ok((name.to_string(), tensor.clone()))
                })
                .collect()
        };
        let mut entries = Vec::new();
        for e in h["entries"].as_array().ok_or("no entries")? {
            let key = e["key"]
                .as_str()
                .and_then(|k| u64::from_str_radix(k, 16).ok())
                .ok_or("an entry without a key")?;
            let dtype = e["dtype"]
                .as_str()
                .and_then(parse_dtype)
                .ok_or("an entry without a dtype")?;
            entries.push(Entry {
                key,
                dtype,
                case: e["case"].as_str().unwrap_or_default().to_string(),
                outputs: ReferenceOutputs {
                    state_dict: match &e["state_dict"] {
                        Json::Null => Vec::new(),
                        s => named(s)?,
                    },
                    buffers: wire::strings(&e["buffers"]),
                    unsaved: wire::strings(&e["unsaved"]),
                    aliases: e["aliases"]
                        .as_array()
                        .map(|g| g.iter().map(wire::strings).collect())
                        .unwrap_or_default(),
                    kept: Vec::new(),
                    state_id: None,
                    expected: named(&e["expected"])?,
                    rounding: match &e["rounding"] {
                        Json::Null => None,
                        r => Some(named(r)?),
                    },
                    precise: match &e["precise"] {
                        Json::Null => None,
                        p => Some(named(p)?),
                    },
                    precise_error: e["precise_error"].as_str().map(str::to_string),
                    unexplained: e["unexplained"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(unexplained_of)
                        .collect::<Result<_, _>>()?,
                    mutated: wire::strings(&e["mutated"]),
                },
            });
        }
        for (i, e) in entries.iter().enumerate() {
            check_names(e).map_err(|why| {
                format!(
                    "entry {} of {} ({}): {why}; a hostile or hand-edited store?",
                    i + 1,
                    entries.len(),
                    e.case
                )
            })?;
        }
        let kept = h["cases"]["kept"].as_u64().unwrap_or(0) as usize;
        let evaluated = h["cases"]["evaluated"].as_u64().unwrap_or(0) as usize;
        let description = h["description"]
            .as_str()
            .ok_or("no description")?
            .to_string();
        let cut = check_cases(&description, &entries, kept, evaluated, &h["cases"])?;
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key, i))
            .collect();
        let mut budgeted = Vec::new();
        if let Some(counts) = h["budgeted"].as_object() {
            for (name, n) in counts {
                let dtype = parse_dtype(name)
                    .ok_or_else(|| format!("`budgeted` names the dtype {name:?}"))?;
                let n = n
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("`budgeted` gives {name} {n}, not a number of cases"))?;
                budgeted.push((dtype, n as usize));
            }
        }
        Ok(Store {
            path: path.to_path_buf(),
            description,
            budgeted,
            partial: (kept < evaluated).then_some((kept, evaluated)),
            cut,
            params: match (&h["params"], format) {
                (Json::Null, _) => Vec::new(),
                (p, FORMAT_2) => vec![(
                    None,
                    ParamSpec::from_json(p, t).map_err(|e| format!("`params`: {e}"))?,
                )],
                (p, _) => p
                    .as_array()
                    .ok_or("`params` is not a list")?
                    .iter()
                    .map(|item| {
                        let key = item["construction"].as_str().map(str::to_string);
                        let spec = ParamSpec::from_json(&item["spec"], t)
                            .map_err(|e| format!("`params`: {e}"))?;
                        Ok((key, spec))
                    })
                    .collect::<Result<_, String>>()?,
            },
            provenance: Provenance::from_json(&h["recorded_with"]),
            entries,
            index,
        })
    }

    /// The module's parameter list for a construction key ([`Layer::construction_key`]).
    pub fn params_for(&self, key: &str) -> Option<&ParamSpec> {
        self.params
            .iter()
            .find(|(k, _)| k.as_deref().is_none_or(|k| k == key))
            .map(|(_, spec)| spec)
    }

    /// The recorded outputs of a case.
    pub fn get(&self, key: u64) -> Option<&ReferenceOutputs> {
        self.index.get(&key).map(|&i| &self.entries[i].outputs)
    }

    /// The recorded cases, in the order they ran.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Number of recorded cases.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::inputs::float_tensor;

    fn entry(key: u64, n: usize) -> Entry {
        let values: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
        Entry {
            key,
            dtype: DType::BF16,
            case: format!("case {key}"),
            outputs: ReferenceOutputs {
                state_dict: vec![("w".into(), float_tensor(vec![n], &values, DType::BF16))],
                buffers: Vec::new(),
                expected: vec![("out".into(), float_tensor(vec![n], &values, DType::BF16))],
                rounding: Some(vec![(
                    "out".into(),
                    float_tensor(vec![n], &values, DType::BF16),
                )]),
                ..ReferenceOutputs::default()
            },
        }
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("golden-store-{name}-{}.golden", std::process::id()))
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let path = temp("round");
        let entries = vec![entry(1, 10), entry(2, 3)];
        save(&path, "desc", &[], None, &entries, 1 << 20, 0).unwrap();
        let first = std::fs::read(&path).unwrap();
        save(&path, "desc", &[], None, &entries, 1 << 20, 0).unwrap();
        assert_eq!(first, std::fs::read(&path).unwrap(), "byte for byte");
        let store = Store::load(&path).unwrap().unwrap();
        assert_eq!(store.description, "desc");
        assert_eq!(store.get(2), Some(&entries[1].outputs));
        assert_eq!(store.partial, None);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn every_truncation_and_any_flipped_byte_is_corrupt_never_a_store() {
        let path = temp("corrupt");
        save(&path, "desc", &[], None, &[entry(7, 4)], 1 << 20, 0).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            let err = Store::decode(&path, bytes[..cut].to_vec()).unwrap_err();
            assert!(
                matches!(err, StoreError::Corrupt(..)),
                "cut at {cut}: {err}"
            );
        }
        for at in [0, 9, 15, 30, bytes.len() / 2, bytes.len() - 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x40;
            let err = Store::decode(&path, flipped).unwrap_err().to_string();
            assert!(err.contains("is corrupt"), "flip at {at}: {err}");
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn names_that_could_lead_outside_are_refused_when_written_and_corrupt_when_read() {
        let path = temp("names");
        for name in ["../x", "/abs", "a/b", "a\\b", "out..", "nul\0", "C:\\x"] {
            let mut e = entry(1, 2);
            e.outputs.state_dict[0].0 = name.to_string();
            let err = save(&path, "desc", &[], None, &[e], 1 << 20, 0)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("the state_dict entry name {name:?}")),
                "{err}"
            );
        }
        // Read: a store written with a fine name, renamed afterwards and sealed again.
        save(
            &path,
            "desc",
            &[],
            None,
            &[entry(1, 2), entry(2, 2)],
            1 << 20,
            0,
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut frame = wire::read_frame(&mut &bytes[PREAMBLE..]).unwrap();
        frame.header["entries"][1]["expected"][0][0] = "../../up".into();
        let err = Store::decode(&path, seal(&wire::encode(&frame)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "is corrupt (entry 2 of 2 (case 2): the output name \"../../up\" contains `..`"
            ),
            "{err}"
        );
        assert_eq!(unsafe_name("fc1.weight"), None);
        assert_eq!(unsafe_name("trace.blocks.2.attn#2"), None);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_size_bound_keeps_the_first_cases_and_says_so() {
        let path = temp("bound");
        let entries: Vec<Entry> = (0..10).map(|k| entry(k, 1000)).collect();
        let (kept, size) = save(&path, "desc", &[], None, &entries, 20_000, 0).unwrap();
        assert!(kept > 0 && kept < 10, "{kept}");
        assert!(size <= 20_000, "{size}");
        let store = Store::load(&path).unwrap().unwrap();
        assert_eq!(store.partial, Some((kept, 10)));
        assert!(store.get(0).is_some() && store.get(9).is_none());
        std::fs::remove_file(path).unwrap();
    }
}
