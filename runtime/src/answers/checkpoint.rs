//! A checkpoint (`weights = "..."`) at any size: mapped once per process, identified by one content
//! hash, and resolved once against the reference module's state_dict.
//!
//! **One file or shards.** `weights` names a `.safetensors` file, or the index of a sharded one
//! (`model.safetensors.index.json`, whose `weight_map` names each tensor's file, as
//! `save_pretrained` writes a checkpoint past its `max_shard_size` and as published checkpoints
//! of several GB come), or the folder `save_pretrained` wrote (its index, else its
//! `model.safetensors`). A sharded checkpoint is one checkpoint: one hash, one name space.
//!
//! **Once per process.** [`open`] maps each `.safetensors` file (`memmap2`): its tensors are slices
//! of the mapping, never copied, whatever their size (a 2 GB checkpoint costs the page cache, not
//! the heap). It hashes the files' bytes once (XXH3-128, at memory speed; a sharded checkpoint's
//! index and shards as one stream) and keeps mapping and hash, by path, for as long as every file
//! stays the same (its inode, size and modification time): every check of the process that names
//! the checkpoint shares one mapping and one hash. A checkpoint that changes is mapped and hashed
//! again.
//!
//! **Unchanged while it is read.** A mapped file written over in place changes under both readers:
//! the reference and the port read the new bytes (zeros, half a new checkpoint), and a page past the
//! end of a file cut short is SIGBUS to whoever reads it. So a check looks at the files again after
//! each answer of the reference and after each case ([`Checkpoint::changed`]); a change stops the
//! check with [`changed_error`], which names the file and what became of it and blames nothing on
//! the port (the worker dead of SIGBUS included), rather than a verdict on bytes nobody hashed.
//!
//! **Resolved once.** [`Checkpoint::resolve`] matches every entry of the reference module's
//! state_dict with a tensor of the checkpoint: by its name as the port sees it (`rename`), by its
//! own name, or by any name tied to it (the module's alias groups: `save_pretrained` writes one name
//! of a tied pair, `model.embed_tokens.weight` and not `lm_head.weight`, and a tied entry is found
//! under either, in both directions, with nothing to declare). Every mismatch (an entry the
//! checkpoint does not have, a shape that differs) is reported together, once, before any case
//! runs: none of them depends on a case.
//!
//! **Referred to by hash.** The resolved state has an id ([`Resolved::id`]): the checkpoint's hash
//! and the name mapping. The worker loads the state once, from the files themselves
//! ([`Resolved::to_json`] tells it each file's path, size, modification time and inode, and which
//! file holds each entry), and every request names the id; the golden store's key holds the id
//! instead of the tensors' bytes.
//!
//! **One copy for the port.** The port's tensors are made once per process and dtype
//! ([`Resolved::port_tensors`]), each converted straight from the mapped bytes (a bf16 checkpoint
//! checked in float32 becomes float32 once, with no bf16 copy kept) and its mapped pages given
//! back to the page cache as soon as it is copied: what the test process holds is the port's copy,
//! not the checkpoint a second time.

use crate::answers::params::{renamed, ParamSpec};
use crate::python::wire::TensorTable;
use crate::python::worker::{RemoteError, RemoteKind, WorkerError};
use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// A checkpoint, its files mapped, and its content hash.
pub struct Checkpoint {
    /// What the check named: the `.safetensors` file, or the index of a sharded checkpoint.
    pub path: PathBuf,
    /// The size in bytes of its files together (the index and its shards).
    pub size: u64,
    /// XXH3-128 of every byte of its files (a sharded checkpoint's: the index, then the shards in
    /// [`Checkpoint::files`]' order, as one stream).
    pub hash: u128,
    /// A sharded checkpoint's index (read, not mapped), and what says it is still that file.
    index_file: Option<(PathBuf, Stat)>,
    /// The `.safetensors` files: the one, or the shards in the order of their names.
    files: Vec<Shard>,
    tensors: Vec<(String, HostTensor)>,
    /// Per tensor, the file that holds it.
    file_of: Vec<usize>,
    index: HashMap<String, usize>,
}

/// One mapped `.safetensors` file of a checkpoint.
struct Shard {
    path: PathBuf,
    stat: Stat,
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

/// The name of a sharded checkpoint's index as `save_pretrained` writes it.
pub const INDEX: &str = "model.safetensors.index.json";

/// What `weights` names, made a file: a folder stands for its index, else its `model.safetensors`.
fn named_file(path: &Path) -> Result<PathBuf, String> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    for name in [INDEX, "model.safetensors"] {
        if path.join(name).is_file() {
            return Ok(path.join(name));
        }
    }
    Err(format!(
        "{} is a folder with neither {INDEX} nor model.safetensors in it (what save_pretrained \
         writes); name the checkpoint's file or its index",
        path.display()
    ))
}

/// Whether `path` names a sharded checkpoint's index (`*.index.json`).
fn is_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
}

/// A sharded checkpoint's shards (in the order of their names) and, per tensor, the shard that
/// holds it.
type Shards = (Vec<PathBuf>, Vec<(String, usize)>);

/// The shards a sharded checkpoint's index names (its `weight_map`'s files).
fn shards_of(index: &Path, text: &[u8]) -> Result<Shards, String> {
    let json: Json = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or("it has no `weight_map` (the name of each tensor's file)")?;
    let dir = index.parent().unwrap_or_else(|| Path::new("."));
    let mut names: Vec<&str> = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| format!("its `weight_map` gives `{tensor}` no file name"))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(format!(
                "its `weight_map` puts `{tensor}` in {file:?}, not a file beside the index"
            ));
        }
        names.push(file);
    }
    names.sort_unstable();
    names.dedup();
    let of = |file: &str| names.binary_search(&file).expect("listed");
    let tensors = map
        .iter()
        .map(|(t, f)| (t.clone(), of(f.as_str().expect("checked"))))
        .collect();
    Ok((names.iter().map(|n| dir.join(n)).collect(), tensors))
}

/// Map one `.safetensors` file.
fn map_file(path: &Path) -> Result<(Stat, Arc<memmap2::Mmap>), String> {
    let now = stat(path)?;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is read-only; a file truncated by another process while mapped would
    // fault, as any reader of a file that shrinks under it (it is looked at again at every open,
    // after each of the reference's answers and after each case: `Checkpoint::changed`).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
    Ok((now, Arc::new(map)))
}

/// The checkpoint `weights` names (a file, an index, or a folder: see the module docs), mapped and
/// hashed once per process while its files stay the same.
pub fn open(path: &Path) -> Result<Arc<Checkpoint>, String> {
    let shown = path.display().to_string();
    let fail = |e: String| format!("weights = {shown:?}: {e}");
    let key = path.to_path_buf();
    let named = named_file(path).map_err(fail)?;
    if let Some(found) = cache().lock().unwrap().get(&key).cloned() {
        if found.changed().is_none() {
            return Ok(found);
        }
    }
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let (index_file, shard_paths, listed) = if is_index(&named) {
        let before = stat(&named).map_err(fail)?;
        let text = std::fs::read(&named).map_err(|e| fail(e.to_string()))?;
        let (shards, listed) = shards_of(&named, &text)
            .map_err(|e| fail(format!("the index {}: {e}", named.display())))?;
        hasher.update(&text);
        (Some((named.clone(), before)), shards, Some(listed))
    } else {
        (None, vec![named.clone()], None)
    };
    let mut files = Vec::with_capacity(shard_paths.len());
    let mut tensors = Vec::new();
    let mut file_of: Vec<usize> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (k, shard) in shard_paths.iter().enumerate() {
        let what = |e: String| match &index_file {
            Some(_) => fail(format!("its shard {}: {e}", shard.display())),
            None => fail(e),
        };
        let (now, map) = map_file(shard).map_err(what)?;
        hasher.update(&map);
        let bytes = Bytes::from_owner(Mapped(Arc::clone(&map)));
        for (name, t) in golden_files::safetensors::read_shared(bytes).map_err(what)? {
            // A sharded checkpoint's tensors are those its index lists, each in its own shard.
            if let Some(listed) = &listed {
                if !listed.iter().any(|(n, f)| *n == name && *f == k) {
                    continue;
                }
            }
            if let Some(&earlier) = index.get(&name) {
                return Err(fail(format!(
                    "`{name}` is in both {} and {}: a tensor is in one file of a checkpoint",
                    shard_paths[file_of[earlier]].display(),
                    shard.display()
                )));
            }
            index.insert(name.clone(), tensors.len());
            tensors.push((name, t));
            file_of.push(k);
        }
        files.push(Shard {
            path: shard.clone(),
            stat: now,
            map,
        });
    }
    if let Some(listed) = &listed {
        let absent: Vec<String> = listed
            .iter()
            .filter(|(n, _)| !index.contains_key(n))
            .take(4)
            .map(|(n, f)| format!("`{n}` (in {})", shard_paths[*f].display()))
            .collect();
        if !absent.is_empty() {
            return Err(fail(format!(
                "its index names tensors that their shard does not hold: {}; the shards are not \
                 the ones the index was written with",
                absent.join(", ")
            )));
        }
    }
    HASHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let size = index_file.as_ref().map_or(0, |(_, s)| s.size)
        + files.iter().map(|f| f.stat.size).sum::<u64>();
    let checkpoint = Arc::new(Checkpoint {
        path: key.clone(),
        size,
        hash: hasher.digest128(),
        index_file,
        files,
        tensors,
        file_of,
        index,
    });
    // Hashing read every page: they stay in the page cache, not in this process's resident set.
    checkpoint.release();
    cache().lock().unwrap().insert(key, Arc::clone(&checkpoint));
    Ok(checkpoint)
}

/// The size of a page of memory (what `madvise` ranges are counted in).
fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// What became of a file since `then`, if it is no longer that file.
fn became(path: &Path, then: Stat) -> Option<String> {
    let now = match stat(path) {
        Ok(now) if now == then => return None,
        Ok(now) => now,
        Err(e) => return Some(format!("was removed or cannot be read any more ({e})")),
    };
    Some(if now.inode != then.inode {
        format!(
            "was replaced by another file (inode {} where it was {})",
            now.inode.1, then.inode.1
        )
    } else if now.size < then.size {
        format!("was truncated from {} to {} bytes", then.size, now.size)
    } else if now.size > then.size {
        format!("grew from {} to {} bytes", then.size, now.size)
    } else {
        format!(
            "was rewritten in place (the same {} bytes, modified since)",
            then.size
        )
    })
}

impl Checkpoint {
    /// What became of the checkpoint since it was hashed, if it is no longer that one: a file of
    /// it removed, replaced by another, cut short, grown or rewritten in place. One `stat` per
    /// file: its inode, size and modification time (a rewrite of the same size within the file
    /// system's timestamp granularity of the hash is the one change it cannot see).
    pub fn changed(&self) -> Option<String> {
        let sharded = self.index_file.is_some();
        if let Some((path, then)) = &self.index_file {
            if let Some(what) = became(path, *then) {
                return Some(format!("its index {} {what}", path.display()));
            }
        }
        self.files.iter().find_map(|f| {
            let what = became(&f.path, f.stat)?;
            Some(if sharded {
                format!("its shard {} {what}", f.path.display())
            } else {
                what
            })
        })
    }

    /// The content hash in hex (32 digits), as snapshots, artifacts and the worker show it.
    pub fn hash_hex(&self) -> String {
        format!("{:032x}", self.hash)
    }

    /// A tensor of the checkpoint, by its name in the checkpoint.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }

    /// The checkpoint's tensors, in its files' order.
    pub fn tensors(&self) -> &[(String, HostTensor)] {
        &self.tensors
    }

    /// The files golden hashed, in the order of the hash: a sharded checkpoint's index, then its
    /// shards; or the one file.
    pub fn files(&self) -> Vec<&Path> {
        self.index_file
            .iter()
            .map(|(p, _)| p.as_path())
            .chain(self.files.iter().map(|f| f.path.as_path()))
            .collect()
    }

    /// The file that holds the tensor `name` (its index among the `.safetensors` files).
    fn file_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|&i| self.file_of[i])
    }

    /// The `.safetensors` file that holds the tensor `name`.
    pub fn file_holding(&self, name: &str) -> Option<&Path> {
        self.file_of(name).map(|k| self.files[k].path.as_path())
    }

    /// Give the mapped pages this process has read back to the page cache (they are read again
    /// from it if needed): what was copied out of the checkpoint (the port's tensors) is what
    /// this process holds, not the checkpoint a second time.
    pub fn release(&self) {
        for f in &self.files {
            // SAFETY: a read-only shared file mapping: DONTNEED drops this process's references
            // to the pages, and a later read faults them in again from the file.
            #[cfg(unix)]
            unsafe {
                let _ = f.map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
            }
        }
    }

    /// Give back to the page cache the mapped pages that lie wholly inside `bytes` (a tensor of
    /// this checkpoint; nothing for other memory).
    pub fn release_bytes(&self, bytes: &[u8]) {
        let start = bytes.as_ptr() as usize;
        let end = start + bytes.len();
        for f in &self.files {
            let base = f.map.as_ptr() as usize;
            if start < base || end > base + f.map.len() {
                continue;
            }
            let page = page_size();
            let first = (start - base).div_ceil(page) * page;
            let last = (end - base) / page * page;
            if last > first {
                // SAFETY: as in `release`, on a range of the mapping.
                #[cfg(unix)]
                unsafe {
                    let _ = f.map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        first,
                        last - first,
                    );
                }
            }
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
            named: OnceLock::new(),
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
    named: OnceLock<Named>,
}

/// A state's tensors, by the reference's names.
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

    /// The state as the checkpoint holds it, by the reference's names: the file's tensors
    /// themselves (views of the mapping, in the file's dtype: no copy), and the module's own values
    /// for the entries the checkpoint does not hold.
    pub fn named(&self) -> Arc<Vec<(String, HostTensor)>> {
        self.named
            .get_or_init(|| {
                Arc::new(
                    self.entries
                        .iter()
                        .map(|(name, served)| {
                            let t = match served {
                                Served::File(f) => {
                                    self.checkpoint.get(f).expect("resolved").clone()
                                }
                                Served::Value(v) => v.clone(),
                            };
                            (name.clone(), t)
                        })
                        .collect(),
                )
            })
            .clone()
    }

    /// The port's tensors, one per entry in state_dict order, in `dtype` (float entries; the others
    /// as they are): made once per process and dtype and shared by every case and check of this
    /// state (a forward check reads them and never trains them), each converted straight from the
    /// mapped bytes, its pages given back to the page cache as soon as it is copied, and a tied
    /// entry the same tensor as the first of its names. The previous state's tensors go first:
    /// one whole model at a time in memory.
    pub fn port_tensors(&self, dtype: DType) -> candle_core::Result<Arc<Vec<Tensor>>> {
        type Made = (u64, DType, Arc<Vec<Tensor>>);
        static MADE: Mutex<Option<Made>> = Mutex::new(None);
        let mut slot = MADE.lock().unwrap();
        if let Some((id, d, made)) = &*slot {
            if *id == self.id && *d == dtype {
                return Ok(Arc::clone(made));
            }
        }
        *slot = None;
        let device = Device::Cpu;
        let mut made: Vec<Tensor> = Vec::with_capacity(self.entries.len());
        let mut first_of: HashMap<&str, usize> = HashMap::new();
        for (k, (_, served)) in self.entries.iter().enumerate() {
            let t = match served {
                Served::File(f) => {
                    if let Some(&j) = first_of.get(f.as_str()) {
                        made.push(made[j].clone());
                        continue;
                    }
                    first_of.insert(f, k);
                    self.checkpoint.get(f).expect("resolved")
                }
                Served::Value(v) => v,
            };
            let c = t.to_candle(&device)?;
            let c = if c.dtype().is_float() && c.dtype() != dtype {
                c.to_dtype(dtype)?
            } else {
                c
            };
            self.checkpoint.release_bytes(&t.data);
            made.push(c);
        }
        let made = Arc::new(made);
        *slot = Some((self.id, dtype, Arc::clone(&made)));
        Ok(made)
    }

    /// What the worker needs to load the state itself: the checkpoint's files (each one's path,
    /// size, modification time and inode) and, per entry of the state_dict, the file that holds
    /// it and its name there; entries the checkpoint does not hold travel as tensors of `table`.
    pub fn to_json(&self, table: &mut TensorTable) -> Json {
        let c = &self.checkpoint;
        let entries: Vec<Json> = self
            .entries
            .iter()
            .map(|(name, served)| match served {
                Served::File(f) => json!([name, [c.file_of(f).expect("resolved"), f]]),
                Served::Value(v) => json!([name, table.add(v.clone())]),
            })
            .collect();
        let files: Vec<Json> = c
            .files
            .iter()
            .map(|f| {
                json!({
                    "path": f.path.display().to_string(),
                    "size": f.stat.size,
                    "mtime_ns": f.stat.mtime_ns.to_string(),
                    "inode": [f.stat.inode.0.to_string(), f.stat.inode.1.to_string()],
                })
            })
            .collect();
        json!({
            "id": self.id_hex(),
            "hash": c.hash_hex(),
            "files": files,
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
    use candle_core::{DType, Device, Tensor};
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    /// A `.safetensors` file of one f32 tensor `t` holding `value`.
    fn file(path: &std::path::Path, value: f32) {
        let header = br#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&value.to_le_bytes());
        std::fs::write(path, bytes).unwrap();
    }

    /// A fresh folder for one test.
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("golden-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A sharded checkpoint in `dir` as `save_pretrained` writes one: `a` (4 values) in the first
    /// shard, `b` (3) and `c` (a bf16 [256, 64], 32 KiB) in the second, and the index.
    fn sharded(dir: &Path) -> PathBuf {
        let cpu = Device::Cpu;
        let a = Tensor::new(&[1f32, 2., 3., 4.], &cpu).unwrap();
        let b = Tensor::new(&[-1f32, 0.5, 0.25], &cpu).unwrap();
        let c = Tensor::arange(0f32, 256.0 * 64.0, &cpu)
            .and_then(|t| t.reshape((256, 64)))
            .and_then(|t| t.affine(1.0 / 1024.0, 0.0))
            .and_then(|t| t.to_dtype(DType::BF16))
            .unwrap();
        candle_core::safetensors::save(
            &HashMap::from([("a".to_string(), a)]),
            dir.join("model-00001-of-00002.safetensors"),
        )
        .unwrap();
        candle_core::safetensors::save(
            &HashMap::from([("b".to_string(), b), ("c".to_string(), c)]),
            dir.join("model-00002-of-00002.safetensors"),
        )
        .unwrap();
        let index = dir.join(super::INDEX);
        std::fs::write(
            &index,
            r#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        index
    }

    /// The bytes this process has of the mappings of `file` (its resident pages, `/proc/self/smaps`).
    fn resident(file: &Path) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let shown = file.display().to_string();
        let mut ours = false;
        let mut total = 0;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or_default();
            if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                ours = line.ends_with(&shown);
            } else if ours && line.starts_with("Rss:") {
                let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
                total += kb * 1024;
            }
        }
        total
    }

    #[test]
    fn a_sharded_checkpoint_is_one_checkpoint_read_through_its_index() {
        let dir = folder("sharded");
        let index = sharded(&dir);
        // The index, and the folder save_pretrained wrote, name the same checkpoint.
        let by_index = super::open(&index).unwrap();
        let by_folder = super::open(&dir).unwrap();
        assert_eq!(by_index.hash, by_folder.hash);
        let names: Vec<&str> = by_index.tensors().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            by_index.file_holding("c"),
            Some(dir.join("model-00002-of-00002.safetensors").as_path())
        );
        // The hash is of the index and the shards as one stream, in `files()`'s order (what
        // repro.py hashes again).
        let mut stream = Vec::new();
        for f in by_index.files() {
            stream.extend(std::fs::read(f).unwrap());
        }
        assert_eq!(by_index.hash, xxhash_rust::xxh3::xxh3_128(&stream));
        assert_eq!(by_index.size, stream.len() as u64);
        // A shard cut short is named.
        let shard = dir.join("model-00002-of-00002.safetensors");
        let bytes = std::fs::read(&shard).unwrap();
        std::fs::write(&shard, &bytes[..bytes.len() - 8]).unwrap();
        let what = by_index.changed().unwrap();
        assert!(
            what.starts_with(&format!("its shard {} was truncated", shard.display())),
            "{what}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_index_that_does_not_match_its_shards_is_refused_with_what_is_wrong() {
        let dir = folder("bad-index");
        let index = sharded(&dir);
        let write = |text: &str| std::fs::write(&index, text).unwrap();
        write(
            r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}}"#,
        );
        let e = super::open(&index).unwrap_err();
        assert!(
            e.contains("its index names tensors that their shard does not hold: `z`"),
            "{e}"
        );
        write(r#"{"weight_map": {"a": "model-00003-of-00003.safetensors"}}"#);
        let e = super::open(&index).unwrap_err();
        assert!(
            e.contains("its shard") && e.contains("model-00003-of-00003.safetensors"),
            "{e}"
        );
        write(r#"{"weight_map": {"a": "../elsewhere.safetensors"}}"#);
        let e = super::open(&index).unwrap_err();
        assert!(e.contains("not a file beside the index"), "{e}");
        write(r#"{"metadata": {}}"#);
        let e = super::open(&index).unwrap_err();
        assert!(e.contains("has no `weight_map`"), "{e}");
        let empty = folder("empty-checkpoint");
        let e = super::open(&empty).unwrap_err();
        assert!(
            e.contains("neither model.safetensors.index.json nor"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn the_ports_tensors_are_converted_straight_from_the_file_and_its_pages_given_back() {
        let dir = folder("port-tensors");
        let index = sharded(&dir);
        let checkpoint = super::open(&index).unwrap();
        let spec = crate::answers::params::ParamSpec::from_json(
            &serde_json::json!({
                "entries": [
                    {"name": "a", "shape": [4], "float": true},
                    {"name": "tied", "shape": [4], "float": true},
                    {"name": "c", "shape": [256, 64], "float": true},
                ],
                "aliases": [["a", "tied"]],
            }),
            &[],
        )
        .unwrap();
        let resolved = checkpoint.resolve(&spec, &[]).unwrap();
        let shard = dir.join("model-00002-of-00002.safetensors");
        // Read as a port's copy is made: every page of the file is this process's.
        let c = checkpoint.get("c").unwrap();
        assert!(c.data.iter().map(|b| *b as u64).sum::<u64>() > 0);
        assert!(resident(&shard) >= 28 << 10, "{}", resident(&shard));
        let made = resolved.port_tensors(DType::F32).unwrap();
        // The file's pages went back as the tensors were copied (those on the copied tensor's
        // edges may stay: a page it shares with the header or another tensor).
        assert!(resident(&shard) <= 8 << 10, "{}", resident(&shard));
        // bf16 in the file, f32 for the port, exactly; the tied name is the same tensor.
        assert_eq!(made[2].dtype(), DType::F32);
        let expected = c
            .to_candle(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let diff = (&made[2] - &expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
        assert_eq!(made[0].id(), made[1].id());
        // Made once per process and dtype.
        let again = resolved.port_tensors(DType::F32).unwrap();
        assert!(std::sync::Arc::ptr_eq(&made, &again));
        std::fs::remove_dir_all(&dir).unwrap();
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
