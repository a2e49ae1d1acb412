//! A checkpoint (`weights = "..."`) at any size: mapped once per process, identified by one content
//! hash, and resolved once against the reference module's state_dict.
//!
//! **Once per process.** [`open`] maps the `.safetensors` file (`memmap2`): its tensors are slices
//! of the mapping, never copied, whatever their size (a 2 GB checkpoint costs the page cache, not
//! the heap). It hashes the file's bytes once (XXH3-128, at memory speed) and keeps both, by path,
//! for as long as the file stays the same (its inode, size and modification time): every check of
//! the process that names the file shares one mapping and one hash. A file that changes is mapped
//! and hashed again.
//!
//! **Unchanged while it is read.** A mapped file written over in place changes under both readers:
//! the reference and the port read the new bytes (zeros, half a new checkpoint), and a page past the
//! end of a file cut short is SIGBUS to whoever reads it. So a check looks at the file again after
//! each answer of the reference and after each case ([`Checkpoint::changed`]); a change stops the
//! check with [`changed_error`], which names the file and what became of it and blames nothing on
//! the port (the worker dead of SIGBUS included), rather than a verdict on bytes nobody hashed.
//!
//! **Resolved once.** [`Checkpoint::resolve`] matches every entry of the reference module's
//! state_dict with a tensor of the file: by its name as the port sees it (`rename`), by its own
//! name, or by any name tied to it (the module's alias groups: `save_pretrained` writes one name of
//! a tied pair, `model.embed_tokens.weight` and not `lm_head.weight`, and a tied entry is found
//! under either, in both directions, with nothing to declare). Every mismatch (an entry the file
//! does not have, a shape that differs) is reported together, once, before any case runs: none of
//! them depends on a case.
//!
//! **Referred to by hash.** The resolved state has an id ([`Resolved::id`]): the checkpoint's hash
//! and the name mapping. The worker loads the state once, from the file itself ([`Resolved::to_json`]
//! tells it the path, size, modification time and names), and every request names the id; the
//! golden store's key holds the id instead of the tensors' bytes.

use crate::answers::params::{renamed, ParamSpec};
use crate::python::wire::TensorTable;
use crate::python::worker::{RemoteError, RemoteKind, WorkerError};
use bytes::Bytes;
use candle_core::DType;
use golden_files::{HostTensor, WireDType};
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// A mapped `.safetensors` checkpoint and its content hash.
pub struct Checkpoint {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, in nanoseconds since the epoch (what the worker checks too).
    pub mtime_ns: u128,
    /// Its device and inode: the file itself (one renamed into its place is another).
    pub inode: (u64, u64),
    /// XXH3-128 of every byte of the file.
    pub hash: u128,
    tensors: Vec<(String, HostTensor)>,
    index: HashMap<String, usize>,
    map: Arc<memmap2::Mmap>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Checkpoint({}, {})",
            self.path.display(),
            self.hash_hex()
        )
    }
}

/// The mapping, as the owner of the tensors' bytes.
struct Mapped(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A file's size, modification time (ns) and (device, inode): what says it is still the file
/// that was hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    size: u64,
    mtime_ns: u128,
    inode: (u64, u64),
}

fn stat(path: &Path) -> Result<Stat, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(Stat {
        size: meta.len(),
        mtime_ns,
        inode: (meta.dev(), meta.ino()),
    })
}

type Cache = Mutex<HashMap<PathBuf, Arc<Checkpoint>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// How many times this process has hashed a checkpoint (its tests check "once").
static HASHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many checkpoints this process has mapped and hashed so far.
pub fn times_hashed() -> usize {
    HASHED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The checkpoint at `path`, mapped and hashed once per process while its size and modification
/// time stay the same.
pub fn open(path: &Path) -> Result<Arc<Checkpoint>, String> {
    let shown = path.display().to_string();
    let now = stat(path).map_err(|e| format!("weights = {shown:?}: {e}"))?;
    let key = path.to_path_buf();
    if let Some(found) = cache().lock().unwrap().get(&key) {
        if found.stat() == now {
            return Ok(Arc::clone(found));
        }
    }
    let file = std::fs::File::open(path).map_err(|e| format!("weights = {shown:?}: {e}"))?;
    // SAFETY: the mapping is read-only; a file truncated by another process while mapped would
    // fault, as any reader of a file that shrinks under it (it is looked at again at every open,
    // after each of the reference's answers and after each case: `Checkpoint::changed`).
    let map = Arc::new(
        unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("weights = {shown:?}: {e}"))?,
    );
    let hash = xxhash_rust::xxh3::xxh3_128(&map);
    HASHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let bytes = Bytes::from_owner(Mapped(Arc::clone(&map)));
    let tensors = golden_files::safetensors::read_shared(bytes)
        .map_err(|e| format!("weights = {shown:?}: {e}"))?;
    let index = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), i))
        .collect();
    let checkpoint = Arc::new(Checkpoint {
        path: key.clone(),
        size: now.size,
        mtime_ns: now.mtime_ns,
        inode: now.inode,
        hash,
        tensors,
        index,
        map,
    });
    // Hashing read every page: they stay in the page cache, not in this process's resident set.
    checkpoint.release();
    cache().lock().unwrap().insert(key, Arc::clone(&checkpoint));
    Ok(checkpoint)
}

/// [`Checkpoint::release`] every checkpoint this process has open.
pub fn release_all() {
    for c in cache().lock().unwrap().values() {
        c.release();
    }
}

impl Checkpoint {
    fn stat(&self) -> Stat {
        Stat {
            size: self.size,
            mtime_ns: self.mtime_ns,
            inode: self.inode,
        }
    }

    /// What became of the file since it was hashed, if it is no longer that file: removed,
    /// replaced by another, cut short, grown or rewritten in place. One `stat`: the file's inode,
    /// size and modification time (a rewrite of the same size within the file system's timestamp
    /// granularity of the hash is the one change it cannot see).
    pub fn changed(&self) -> Option<String> {
        let now = match stat(&self.path) {
            Ok(now) if now == self.stat() => return None,
            Ok(now) => now,
            Err(e) => return Some(format!("was removed or cannot be read any more ({e})")),
        };
        Some(if now.inode != self.inode {
            format!(
                "was replaced by another file (inode {} where it was {})",
                now.inode.1, self.inode.1
            )
        } else if now.size < self.size {
            format!("was truncated from {} to {} bytes", self.size, now.size)
        } else if now.size > self.size {
            format!("grew from {} to {} bytes", self.size, now.size)
        } else {
            format!(
                "was rewritten in place (the same {} bytes, modified since)",
                self.size
            )
        })
    }

    /// The content hash in hex (32 digits), as snapshots, artifacts and the worker show it.
    pub fn hash_hex(&self) -> String {
        format!("{:032x}", self.hash)
    }

    /// A tensor of the file, by its name in the file.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }

    /// The file's tensors, in its order.
    pub fn tensors(&self) -> &[(String, HostTensor)] {
        &self.tensors
    }

    /// Give the mapped pages this process has read back to the page cache (they are read again
    /// from it if needed): what was copied out of the checkpoint (the port's tensors) is what
    /// this process holds, not the checkpoint a second time.
    pub fn release(&self) {
        // SAFETY: a read-only shared file mapping: DONTNEED drops this process's references to the
        // pages, and a later read faults them in again from the file.
        #[cfg(unix)]
        unsafe {
            let _ = self
                .map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
        }
    }

    /// Match every entry of the reference module's state_dict (`spec`) with a tensor of the file:
    /// by its served name (`rename`), its own name, or a name tied to it. All the mismatches at once
    /// when there are any, each with its fix.
    pub fn resolve(
        self: &Arc<Self>,
        spec: &ParamSpec,
        rename: &[(String, String)],
    ) -> Result<Resolved, Vec<String>> {
        let shown = self.path.display().to_string();
        let mut entries = Vec::with_capacity(spec.entries.len());
        let mut problems = Vec::new();
        for entry in &spec.entries {
            let group: Vec<&str> = spec
                .aliases
                .iter()
                .find(|g| g.contains(&entry.name))
                .map(|g| g.iter().map(String::as_str).collect())
                .unwrap_or_else(|| vec![entry.name.as_str()]);
            // Its own name first (served, then as the reference has it), then the tied ones.
            let mut candidates = vec![renamed(&entry.name, rename), entry.name.clone()];
            for n in &group {
                candidates.push(renamed(n, rename));
                candidates.push(n.to_string());
            }
            let found = candidates.iter().find(|n| self.index.contains_key(*n));
            match (found, &entry.value) {
                (Some(name), _) => {
                    let t = self.get(name).expect("indexed");
                    if t.shape != entry.shape {
                        problems.push(format!(
                            "weights = {shown:?}: `{name}` is {:?} in the file and {:?} in the \
                             reference module (`{}`): the checkpoint was saved from another \
                             configuration, or the check builds the module with another one",
                            t.shape, entry.shape, entry.name
                        ));
                        continue;
                    }
                    if !t.dtype.is_float() && entry.value.is_none() {
                        problems.push(format!(
                            "weights = {shown:?}: `{name}` is {} in the file, where the reference \
                             module has a float entry `{}`",
                            t.dtype, entry.name
                        ));
                        continue;
                    }
                    entries.push((entry.name.clone(), Served::File(name.clone())));
                }
                // An entry the module keeps (an integer buffer, a frozen or computed one): as the
                // module has it, when the file does not hold it.
                (None, Some(v)) => entries.push((entry.name.clone(), Served::Value(v.clone()))),
                (None, None) => {
                    let port_name = renamed(&entry.name, rename);
                    let tied = if group.len() > 1 {
                        format!(
                            "; it is tied to {} in the module (one tensor under {} names), and the \
                             file has none of them either — nothing needs declaring for a tie: a \
                             file with any one of the names serves all of them",
                            group
                                .iter()
                                .filter(|n| **n != entry.name)
                                .map(|n| format!("`{n}`"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            group.len()
                        )
                    } else {
                        String::new()
                    };
                    let leaf = entry.name.rsplit('.').next().unwrap_or(&entry.name);
                    let like: Vec<&str> = self
                        .tensors
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .filter(|n| n.rsplit('.').next() == Some(leaf))
                        .take(4)
                        .collect();
                    let like = if like.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; entries of the file with that last name: {}{}",
                            like.join(", "),
                            if like.len() == 4 { ", ..." } else { "" }
                        )
                    };
                    problems.push(format!(
                        "weights = {shown:?} has no `{port_name}` (the reference's `{}`, {:?}){tied}{like}; \
                         fix: save the checkpoint from this module, or map names that differ with \
                         `rename(\"<reference prefix>\" = \"<file prefix>\")`",
                        entry.name, entry.shape
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut id = Vec::new();
        id.extend_from_slice(&self.hash.to_le_bytes());
        for (name, served) in &entries {
            id.extend_from_slice(name.as_bytes());
            id.push(0);
            match served {
                Served::File(f) => id.extend_from_slice(f.as_bytes()),
                Served::Value(v) => {
                    id.push(v.dtype.code());
                    id.extend_from_slice(&v.data);
                }
            }
            id.push(0xff);
        }
        Ok(Resolved {
            id: xxhash_rust::xxh3::xxh3_64(&id),
            checkpoint: Arc::clone(self),
            entries,
            converted: Mutex::new(HashMap::new()),
        })
    }
}

/// The error that stops a check whose checkpoint changed on disk while it was read: `what` became
/// of it ([`Checkpoint::changed`]), and the failure it came with, if any (the worker dead of
/// SIGBUS reading a page of the file that was cut off). A configuration error of the checkpoint
/// (`weights`), never a verdict on the port.
pub fn changed_error(
    checkpoint: &Checkpoint,
    what: &str,
    with: Option<&WorkerError>,
) -> WorkerError {
    let died = match with {
        Some(WorkerError::Exited { status, .. }) if status.contains("SIGBUS") => format!(
            "; the reference's worker died reading it ({status}: a mapped page past the end of a \
             file cut short cannot be read)"
        ),
        Some(WorkerError::Exited { status, .. }) => {
            format!("; the reference's worker died reading it ({status})")
        }
        Some(other) => format!("; the reference failed meanwhile: {other}"),
        None => String::new(),
    };
    WorkerError::Remote(RemoteError {
        kind: RemoteKind::Weights,
        message: format!(
            "the checkpoint {} changed on disk while the check was reading it: it {what}{died}. \
             golden hashed it as the check began (XXH3-128 {}) and the reference and the port read \
             it where it lies, so no case since can be trusted, and none is blamed on the port.\n  \
             fix: do not write a checkpoint while tests read it (write the new one beside it and \
             rename it into place: whoever has the old one open keeps it whole), then run the \
             check again",
            checkpoint.path.display(),
            checkpoint.hash_hex()
        ),
        traceback: None,
        phase: None,
    })
}

/// The resolved states made so far in this process, by id: what a failure's artifacts refer to
/// (`report/artifacts.rs`: the checkpoint's path and hash, never a copy of its tensors).
fn registry() -> &'static Mutex<HashMap<u64, std::sync::Weak<Resolved>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, std::sync::Weak<Resolved>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Make `resolved` findable by its id ([`resolved`]).
pub fn register(resolved: &Arc<Resolved>) {
    registry()
        .lock()
        .unwrap()
        .insert(resolved.id, Arc::downgrade(resolved));
}

/// The resolved state of id `id`, while one made in this process is alive.
pub fn resolved(id: u64) -> Option<Arc<Resolved>> {
    registry().lock().unwrap().get(&id)?.upgrade()
}

/// Where one entry of the reference's state_dict comes from.
#[derive(Clone, Debug)]
pub enum Served {
    /// The file's tensor of this name.
    File(String),
    /// The module's own value (an entry the file does not hold that the module keeps).
    Value(HostTensor),
}

/// A checkpoint resolved against a module's state_dict: what the port is served and the worker
/// loads, under one id.
pub struct Resolved {
    /// The state's id: the checkpoint's hash and the name mapping.
    pub id: u64,
    /// The checkpoint.
    pub checkpoint: Arc<Checkpoint>,
    /// Every state_dict entry, by the reference's name, in state_dict order.
    pub entries: Vec<(String, Served)>,
    converted: Mutex<HashMap<&'static str, Named>>,
}

/// A state's tensors in one dtype, by the reference's names.
type Named = Arc<Vec<(String, HostTensor)>>;

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resolved({:016x}, {:?})", self.id, self.checkpoint)
    }
}

impl Resolved {
    /// The id in hex, as requests carry it.
    pub fn id_hex(&self) -> String {
        format!("{:016x}", self.id)
    }

    /// The state in `dtype`, by the reference's names. A float entry already in `dtype` is the
    /// file's bytes themselves (no copy); another dtype is converted once, straight (candle's
    /// conversion, round to nearest even), and kept.
    pub fn named(&self, dtype: DType) -> Result<Arc<Vec<(String, HostTensor)>>, String> {
        let key = crate::describe::layer::dtype_name(dtype);
        if let Some(found) = self.converted.lock().unwrap().get(key) {
            return Ok(Arc::clone(found));
        }
        let wire = WireDType::from_candle(dtype).ok_or("not a float dtype")?;
        let mut out = Vec::with_capacity(self.entries.len());
        for (name, served) in &self.entries {
            let t = match served {
                Served::File(f) => self.checkpoint.get(f).expect("resolved").clone(),
                Served::Value(v) => v.clone(),
            };
            let t = if t.dtype.is_float() && t.dtype != wire {
                let c = t
                    .to_candle(&candle_core::Device::Cpu)
                    .and_then(|c| c.to_dtype(dtype))
                    .and_then(|c| HostTensor::from_candle(&c))
                    .map_err(|e| format!("converting `{name}` to {key}: {e}"))?;
                c
            } else {
                t
            };
            out.push((name.clone(), t));
        }
        let out = Arc::new(out);
        self.converted.lock().unwrap().insert(key, Arc::clone(&out));
        Ok(out)
    }

    /// What the worker needs to load the state itself: the file (path, size, modification time,
    /// hash) and, per entry of the state_dict, the file's name for it; entries the file does not
    /// hold travel as tensors of `table`.
    pub fn to_json(&self, table: &mut TensorTable) -> Json {
        let c = &self.checkpoint;
        let entries: Vec<Json> = self
            .entries
            .iter()
            .map(|(name, served)| match served {
                Served::File(f) => json!([name, f]),
                Served::Value(v) => json!([name, table.add(v.clone())]),
            })
            .collect();
        json!({
            "id": self.id_hex(),
            "path": c.path.display().to_string(),
            "size": c.size,
            "mtime_ns": c.mtime_ns.to_string(),
            "inode": [c.inode.0.to_string(), c.inode.1.to_string()],
            "hash": c.hash_hex(),
            "entries": entries,
        })
    }

    /// The number of elements of the state (tied names once per file tensor).
    pub fn elements(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .map(|(_, s)| match s {
                Served::File(f) if seen.insert(f.clone()) => {
                    self.checkpoint.get(f).map_or(0, HostTensor::numel)
                }
                Served::File(_) => 0,
                Served::Value(v) => v.numel(),
            })
            .sum()
    }

    /// The largest finite magnitude among the state's float tensors (part of the scale rounding
    /// errors are relative to), computed once.
    pub fn largest(&self) -> f64 {
        static LARGEST: OnceLock<Mutex<HashMap<u64, f64>>> = OnceLock::new();
        let cache = LARGEST.get_or_init(Default::default);
        if let Some(&m) = cache.lock().unwrap().get(&self.id) {
            return m;
        }
        let mut largest = 0.0f64;
        let mut buffer = vec![0.0f64; 4096];
        let mut seen = std::collections::HashSet::new();
        for (_, served) in &self.entries {
            let t = match served {
                Served::File(f) if seen.insert(f.clone()) => {
                    self.checkpoint.get(f).expect("resolved")
                }
                Served::File(_) => continue,
                Served::Value(v) => v,
            };
            if !t.dtype.is_float() {
                continue;
            }
            let n = t.numel();
            for start in (0..n).step_by(buffer.len()) {
                let len = buffer.len().min(n - start);
                t.read_f64_into(start, &mut buffer[..len]);
                for x in &buffer[..len] {
                    if x.is_finite() {
                        largest = largest.max(x.abs());
                    }
                }
            }
        }
        self.checkpoint.release();
        cache.lock().unwrap().insert(self.id, largest);
        largest
    }
}

#[cfg(test)]
mod tests {
    /// A `.safetensors` file of one f32 tensor `t` holding `value`.
    fn file(path: &std::path::Path, value: f32) {
        let header = br#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&value.to_le_bytes());
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_checkpoint_that_changes_on_disk_is_told_what_became_of_it() {
        let dir = std::env::temp_dir().join(format!("golden-changed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        file(&path, 1.0);
        let checkpoint = super::open(&path).unwrap();
        assert_eq!(checkpoint.changed(), None);
        // Another file renamed into its place: the mapping keeps the old one, the path does not.
        let other = dir.join("other.safetensors");
        file(&other, 2.0);
        std::fs::rename(&other, &path).unwrap();
        let what = checkpoint.changed().unwrap();
        assert!(what.starts_with("was replaced by another file"), "{what}");
        // Grown, and then gone.
        let grown = super::open(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(
            grown.changed().as_deref(),
            Some(format!("grew from {} to {} bytes", grown.size, grown.size + 8).as_str())
        );
        std::fs::remove_file(&path).unwrap();
        let what = grown.changed().unwrap();
        assert!(what.starts_with("was removed or cannot be read"), "{what}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
