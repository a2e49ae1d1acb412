//! Module form: the reference module's parameters — drawn by golden per case, read from a
//! checkpoint, or the module's own init — and the `state_dict()` served to the port through a
//! `VarBuilder`.
//!
//! **Drawn parameters** ([`ParamSpec::draw`]). A module's own init hides bugs: LayerNorm starts at
//! weight 1 and bias 0, Hugging Face zeroes Linear biases, BatchNorm's running statistics start at
//! 0 and 1; a port that ignores any of them matches at init. So by default golden re-draws every
//! floating-point entry of the state_dict for every case, from the case seed (the same values live,
//! recorded and replayed), keeping each tensor's domain: entries whose initial values are all
//! positive (norm weights, running variances) are drawn log-normally around them, others normally
//! with their mean and spread, constants with a spread of a tenth of their size (at least 0.1).
//! Integer entries keep their values; tied names are one draw.
//!
//! **At unit gain** ([`ParamScale::UnitGain`], the default). An initialiser's scale (Hugging Face's
//! std 0.02) makes a layer shrink what it reads: attention's scores are then almost equal and its
//! softmax almost uniform, so a wrong `rope_theta` moved a tiny Llama's logits by 1e-5 — a hair over
//! the tolerance — where weights of unit gain move them by tenths. So every weight of two or more
//! dimensions is drawn with a spread of at least `1/√fan_in` (a Linear's input features, a
//! convolution's input channels times its kernel, as the worker reports them; else its last
//! dimension), and an embedding's rows with a spread of at least 1: each layer passes on what it
//! reads at the size it read it, and every weight and configuration value shows in the outputs.
//! `params = init_scale` ([`ParamScale::Init`]) keeps each entry's own spread.
//!
//! **Serving.** The tensors live in a `VarMap` (as `Var`s, so gradients w.r.t. them work), behind a
//! backend that remembers what the port asked for. `VarBuilder::from_varmap` would silently *create*
//! a weight the reference lacks; this backend instead records each problem — a name the module does
//! not have, a shape that differs (a transposed Linear weight), an entry the port never reads (a
//! forgotten bias) — so the failure names every one of them. Names the reference ties together
//! (an LM head sharing the embedding's weight) count as one entry: reading either reads both.
//! `rename(...)` maps the reference's names to the port's (transformers 5 renamed modules that
//! candle ports still call by their checkpoint names).

use crate::describe::inputs::Rng;
use crate::describe::layer::ParamScale;
use crate::python::wire;
use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{VarBuilder, VarMap};
use golden_files::{HostTensor, WireDType};
use serde_json::{json, Value as Json};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

/// One entry of the reference module's state_dict, as listed by the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamEntry {
    /// Its name in the reference.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// A buffer, not a parameter (no gradient in PyTorch, not trained).
    pub buffer: bool,
    /// Integer entries are not drawn: their values, as the module has them; so are kept float
    /// entries (see `kept`).
    pub value: Option<HostTensor>,
    /// Float entries: the initial values' mean, spread, and for all-positive values the mean and
    /// spread of their logarithms (over their finite values).
    pub stats: Option<ParamStats>,
    /// Why a float entry keeps its value (`value`) instead of being drawn: `frozen` (a parameter
    /// with `requires_grad=False`) or `computed` (a buffer the module computes at init from a
    /// formula: not constant, the same under another seed).
    pub kept: Option<String>,
    /// The module's construction left it uninitialised (`torch.empty` memory): it is drawn fresh,
    /// from no statistics of its own.
    pub uninitialised: bool,
    /// A weight whose module says how it is read: its fan-in (0 for an embedding's rows).
    pub fan_in: Option<usize>,
}

impl ParamEntry {
    /// The least spread a weight is drawn with at unit gain: `1/√fan_in`, an embedding's rows 1;
    /// `None` for entries of fewer than two dimensions.
    pub fn unit_gain(&self) -> Option<f64> {
        if self.shape.len() < 2 {
            return None;
        }
        let fan_in = self
            .fan_in
            .unwrap_or_else(|| self.shape.last().copied().unwrap_or(1));
        Some(match fan_in {
            0 => 1.0,
            n => 1.0 / (n as f64).sqrt(),
        })
    }
}

impl ParamEntry {
    /// Whether the port may leave it unread: a kept entry is a constant of the module, which a
    /// port may compute itself (candle's Whisper computes the sinusoidal positions Hugging Face
    /// keeps in a frozen parameter).
    pub fn may_go_unread(&self) -> bool {
        self.kept.is_some()
    }
}

/// Statistics of a float entry's initial values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamStats {
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub std: f64,
    /// `(mean, std)` of the logarithms when every value is positive.
    pub log: Option<(f64, f64)>,
}

/// What golden needs to draw a reference module's parameters: its state_dict's entries, and the
/// groups of names that are one tensor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamSpec {
    /// In state_dict order.
    pub entries: Vec<ParamEntry>,
    /// Tied names (each group one tensor).
    pub aliases: Vec<Vec<String>>,
    /// Tied names a checkpoint of the module does not hold (see
    /// [`ReferenceOutputs::unsaved`](crate::answers::live::ReferenceOutputs::unsaved)).
    pub unsaved: Vec<String>,
}

fn f64_of(v: &Json, key: &str) -> Result<f64, String> {
    v[key]
        .as_f64()
        .ok_or_else(|| format!("`{key}` is not a number in {v}"))
}

impl ParamSpec {
    /// Read the worker's answer (or a store's copy of it).
    pub fn from_json(v: &Json, tensors: &[HostTensor]) -> Result<Self, String> {
        let entries = v["entries"]
            .as_array()
            .ok_or("no `entries`")?
            .iter()
            .map(|e| {
                let name = e["name"].as_str().ok_or("an entry without a name")?;
                let shape = e["shape"]
                    .as_array()
                    .ok_or("an entry without a shape")?
                    .iter()
                    .map(|d| d.as_u64().map(|d| d as usize).ok_or("a bad dim"))
                    .collect::<Result<Vec<_>, _>>()?;
                let value = match &e["value"] {
                    Json::Null => None,
                    r => Some(
                        wire::tensor_ref(r, tensors)
                            .map_err(|x| x.to_string())?
                            .clone(),
                    ),
                };
                let finite = |x: f64| -> Result<f64, String> {
                    x.is_finite()
                        .then_some(x)
                        .ok_or_else(|| format!("a statistic that is not finite in {e}"))
                };
                let stats = if e["float"].as_bool() == Some(true) && e.get("mean").is_some() {
                    let log = match (e["log_mean"].as_f64(), e["log_std"].as_f64()) {
                        (Some(m), Some(s)) => Some((m, s)),
                        _ => None,
                    };
                    Some(ParamStats {
                        mean: finite(f64_of(e, "mean")?)?,
                        std: finite(f64_of(e, "std")?)?,
                        log: log.filter(|(m, s)| m.is_finite() && s.is_finite()),
                    })
                } else {
                    None
                };
                Ok(ParamEntry {
                    name: name.to_string(),
                    shape,
                    buffer: e["buffer"].as_bool().unwrap_or(false),
                    value,
                    stats,
                    kept: e["kept"].as_str().map(str::to_string),
                    uninitialised: e["uninitialised"].as_bool().unwrap_or(false),
                    fan_in: e["fan_in"].as_u64().map(|n| n as usize),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let aliases = v["aliases"]
            .as_array()
            .map(|groups| groups.iter().map(wire::strings).collect::<Vec<_>>())
            .unwrap_or_default();
        Ok(ParamSpec {
            entries,
            aliases,
            unsaved: wire::strings(&v["unsaved"]),
        })
    }

    /// The spec as JSON, its integer values added to `table` (for the golden store).
    pub fn to_json(&self, table: &mut wire::TensorTable) -> Json {
        let entries: Vec<Json> = self
            .entries
            .iter()
            .map(|e| {
                let mut j = json!({"name": e.name, "shape": e.shape, "buffer": e.buffer});
                j["float"] = json!(e.value.as_ref().is_none_or(|v| v.dtype.is_float()));
                if let Some(v) = &e.value {
                    j["value"] = table.add(v.clone());
                }
                if let Some(s) = &e.stats {
                    j["mean"] = json!(s.mean);
                    j["std"] = json!(s.std);
                    if let Some((m, sd)) = s.log {
                        j["log_mean"] = json!(m);
                        j["log_std"] = json!(sd);
                    }
                }
                if let Some(k) = &e.kept {
                    j["kept"] = json!(k);
                }
                if e.uninitialised {
                    j["uninitialised"] = json!(true);
                }
                if let Some(n) = e.fan_in {
                    j["fan_in"] = json!(n);
                }
                j
            })
            .collect();
        let mut spec = json!({"entries": entries, "aliases": self.aliases});
        // Only when there are some: the stores of every other module stay what they were.
        if !self.unsaved.is_empty() {
            spec["unsaved"] = json!(self.unsaved);
        }
        spec
    }

    /// The names tied to `name` (itself first), or just `name`.
    fn group_of(&self, name: &str) -> Option<&Vec<String>> {
        self.aliases.iter().find(|g| g.iter().any(|n| n == name))
    }

    /// What a snapshot says about the entries that are not drawn from their own statistics: those
    /// kept as the module has them, and those drawn fresh because the module left them
    /// uninitialised. Empty for a module whose every float entry is drawn as usual.
    pub fn notes(&self, redraw_kept: bool) -> Vec<String> {
        let names = |f: &dyn Fn(&ParamEntry) -> bool| -> Vec<&str> {
            self.entries
                .iter()
                .filter(|e| f(e))
                .map(|e| e.name.as_str())
                .collect()
        };
        let mut out = Vec::new();
        let frozen = names(&|e| e.kept.as_deref() == Some("frozen"));
        let computed = names(&|e| e.kept.as_deref() == Some("computed"));
        let fresh = names(&|e| e.uninitialised);
        if !redraw_kept && !frozen.is_empty() {
            out.push(format!(
                "params kept as the module has them (frozen: requires_grad=False): {}",
                frozen.join(", ")
            ));
        }
        if !redraw_kept && !computed.is_empty() {
            out.push(format!(
                "params kept as the module has them (buffers computed at init, the same under \
                 any seed): {}",
                computed.join(", ")
            ));
        }
        if redraw_kept && !(frozen.is_empty() && computed.is_empty()) {
            out.push(format!(
                "params drawn although the module keeps them (params = drawn_all): {}",
                frozen
                    .iter()
                    .chain(&computed)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !fresh.is_empty() {
            out.push(format!(
                "params drawn fresh, normal(0, 1/√fan_in), because the module leaves them \
                 uninitialised (torch.empty): {}",
                fresh.join(", ")
            ));
        }
        out
    }

    /// The state_dict of one case: every float entry drawn from `seed` in `dtype` at `scale` (see
    /// the module's documentation), integer entries as listed, kept entries as the module has them
    /// (drawn too with `redraw_kept`), tied names one draw.
    pub fn draw(
        &self,
        seed: u64,
        dtype: DType,
        redraw_kept: bool,
        scale: ParamScale,
    ) -> Vec<(String, HostTensor)> {
        let wire = WireDType::from_candle(dtype)
            .filter(|d| d.is_float())
            .unwrap_or(WireDType::F32);
        let mut drawn: Vec<(String, HostTensor)> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            // A tied name takes the draw of the first name of its group.
            let first = self.group_of(&e.name).map(|g| g[0].as_str());
            if let Some(done) = first
                .filter(|f| *f != e.name)
                .and_then(|f| drawn.iter().find(|(n, _)| n == f))
            {
                let t = done.1.clone();
                drawn.push((e.name.clone(), t));
                continue;
            }
            let t = match &e.value {
                Some(v) if !v.dtype.is_float() => v.clone(),
                Some(v) if !redraw_kept => {
                    HostTensor::from_floats(v.shape.clone(), &v.to_f64(), wire)
                }
                _ => {
                    let n: usize = e.shape.iter().product();
                    let z = Rng::new(seed, &format!("param.{}", e.name)).normals(n);
                    // Uninitialised memory says nothing: a fan-in scale, as PyTorch's inits use.
                    let fresh = e.uninitialised.then(|| e.unit_gain().unwrap_or(0.1));
                    // At unit gain a weight's spread is at least its gain's.
                    let least = match scale {
                        ParamScale::UnitGain => e.unit_gain().unwrap_or(0.0),
                        ParamScale::Init => 0.0,
                    };
                    let stats = if fresh.is_some() { None } else { e.stats };
                    let values: Vec<f64> = match stats {
                        Some(ParamStats {
                            log: Some((m, s)), ..
                        }) => {
                            let s = if s > 0.0 { s } else { 0.1 };
                            z.iter().map(|z| (m + s * z).exp()).collect()
                        }
                        Some(ParamStats { mean, std, .. }) => {
                            let s = if std > 0.0 {
                                std
                            } else {
                                0.1 * mean.abs().max(1.0)
                            };
                            let s = s.max(least);
                            z.iter().map(|z| mean + s * z).collect()
                        }
                        None => {
                            let s = fresh.unwrap_or(0.1);
                            z.iter().map(|z| s * z).collect()
                        }
                    };
                    HostTensor::from_floats(e.shape.clone(), &values, wire)
                }
            };
            drawn.push((e.name.clone(), t));
        }
        drawn
    }
}

/// Entries that the port is not expected to read (BatchNorm's step counter).
const NEVER_READ_OK: &[&str] = &["num_batches_tracked"];

/// One problem between the port's requests and the reference's state_dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamIssue {
    /// The port asked for a tensor the reference module does not have.
    Missing {
        /// Full name asked for.
        name: String,
        /// Shape asked for.
        shape: Vec<usize>,
        /// Similar names the module does have.
        close: Vec<String>,
        /// The one entry with the same last name and shape, when there is one: probably this
        /// tensor under another name.
        renamed_from: Option<String>,
    },
    /// The port asked for a tensor with another shape.
    Shape {
        /// Full name.
        name: String,
        /// Shape the port asked for.
        port: Vec<usize>,
        /// Shape in the reference.
        reference: Vec<usize>,
    },
    /// The reference has an entry the port never read.
    Unused {
        /// Full name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape of the `weight` beside it (`<prefix>.weight`), when there is one: which kind
        /// of layer a bias belongs to.
        weight: Option<Vec<usize>>,
    },
    /// The port reads a name of a tied tensor that a checkpoint of the module does not hold
    /// (`lm_head.weight`, which `save_pretrained` leaves out where the configuration ties it to
    /// the embedding): it would not load from a real checkpoint, and as a separate weight it is
    /// another model than the reference's.
    Unsaved {
        /// The name the port reads.
        name: String,
        /// The name of the same tensor a checkpoint holds.
        saved: String,
    },
}

impl fmt::Display for ParamIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamIssue::Missing {
                name,
                shape,
                close,
                renamed_from,
            } => {
                write!(
                    f,
                    "the port asks for `{name}` {shape:?}, which the reference module does not have"
                )?;
                if !close.is_empty() {
                    write!(f, " (it has: {})", close.join(", "))?;
                }
                if let Some(theirs) = renamed_from {
                    // The same tensor under another name: suggest the prefixes to map.
                    let common = name
                        .rsplit('.')
                        .zip(theirs.rsplit('.'))
                        .take_while(|(a, b)| a == b)
                        .map(|(a, _)| a.len() + 1)
                        .sum::<usize>();
                    let (ours, theirs) = (
                        &name[..name.len() - common],
                        &theirs[..theirs.len() - common],
                    );
                    write!(
                        f,
                        " — the reference's `{theirs}{}` has this shape: if it is the same tensor \
                         under another name, map the names with `rename(\"{theirs}.\" = \"{ours}.\")`",
                        &name[name.len() - common..]
                    )?;
                }
                Ok(())
            }
            ParamIssue::Shape {
                name,
                port,
                reference,
            } => {
                write!(
                    f,
                    "the port asks for `{name}` with shape {port:?}; the reference's is {reference:?}"
                )?;
                let mut reversed = reference.clone();
                reversed.reverse();
                if port.len() == 2 && *port == reversed {
                    write!(
                        f,
                        " — transposed: PyTorch's nn.Linear stores weight as [out_features, \
                         in_features]; ask for that shape (candle_nn::linear does) or .t() it"
                    )?;
                }
                Ok(())
            }
            ParamIssue::Unsaved { name, saved } => write!(
                f,
                "the port reads `{name}`, which the reference module ties to `{saved}` (one \
                 tensor, in this configuration): a checkpoint of it (save_pretrained) holds only \
                 `{saved}`, so the port would not load one, and its own `{name}` would be another \
                 weight than the reference's — where the configuration ties them (e.g. \
                 tie_word_embeddings), use `{saved}` (candle: the embedding's weight as the LM head)"
            ),
            ParamIssue::Unused {
                name,
                shape,
                weight,
            } => {
                write!(
                    f,
                    "the reference's state_dict has `{name}` {shape:?}, which the port never reads"
                )?;
                if name.ends_with("bias") {
                    // The layer it belongs to, by the shape of the weight beside it.
                    let hint = match weight.as_ref().map(Vec::len) {
                        Some(2) => "a forgotten bias? (candle_nn::linear_no_bias drops it)",
                        Some(1) => {
                            "a norm's forgotten bias? (candle_nn::LayerNorm::new takes it; \
                             LayerNorm::new_no_bias and RmsNorm have none)"
                        }
                        Some(_) => {
                            "a convolution's forgotten bias? (candle_nn::conv*_no_bias drops it)"
                        }
                        None => "a forgotten bias?",
                    };
                    write!(f, " — {hint}")?;
                }
                Ok(())
            }
        }
    }
}

struct Tracked {
    /// The tensors served, by served name (a `Var`'s own tensor where there are `Var`s).
    tensors: std::collections::HashMap<String, Tensor>,
    /// The `Var`s behind them, for gradients and training (empty when served as plain tensors).
    map: VarMap,
    /// The served (port-side) names, in state_dict order.
    names: Vec<String>,
    /// Served name -> the reference's name, where `rename(...)` changed it.
    renamed: std::collections::HashMap<String, String>,
    /// Groups of served names that are one tensor.
    aliases: Vec<Vec<String>>,
    reads: Mutex<BTreeSet<String>>,
    /// The names the port asked for itself (`reads` adds the other names of a tied group).
    asked: Mutex<BTreeSet<String>>,
    /// Served names a checkpoint of the module does not hold ([`StateDict::not_in_checkpoints`]):
    /// `contains_tensor` says no for them, as a VarBuilder over the real file would.
    unsaved: Mutex<BTreeSet<String>>,
    issues: Mutex<Vec<ParamIssue>>,
}

/// The reference's state_dict, as served to one run of the port.
#[derive(Clone)]
pub struct StateDict {
    inner: Arc<Tracked>,
    dtype: DType,
    device: Device,
}

struct Backend(Arc<Tracked>);

impl Tracked {
    fn lookup(&self, name: &str, wanted: Option<&Shape>) -> candle_core::Result<Tensor> {
        let var = self.tensors.get(name).cloned();
        let Some(var) = var else {
            let close = close_names(name, &self.names);
            let leaf = name.rsplit('.').next().unwrap_or(name);
            let data = &self.tensors;
            let same: Vec<&String> = self
                .names
                .iter()
                .filter(|n| n.rsplit('.').next() == Some(leaf) && n.contains('.'))
                .filter(|n| wanted.is_some_and(|s| data.get(*n).is_some_and(|v| v.shape() == s)))
                .collect();
            let renamed_from = (same.len() == 1 && name.contains('.')).then(|| same[0].clone());
            let issue = ParamIssue::Missing {
                name: name.to_string(),
                shape: wanted.map(|s| s.dims().to_vec()).unwrap_or_default(),
                close,
                renamed_from,
            };
            let msg = issue.to_string();
            self.issues.lock().unwrap().push(issue);
            return Err(candle_core::Error::Msg(format!("golden: {msg}")));
        };
        if let Some(shape) = wanted {
            if var.shape() != shape {
                let issue = ParamIssue::Shape {
                    name: name.to_string(),
                    port: shape.dims().to_vec(),
                    reference: var.dims().to_vec(),
                };
                let msg = issue.to_string();
                self.issues.lock().unwrap().push(issue);
                return Err(candle_core::Error::Msg(format!("golden: {msg}")));
            }
        }
        self.asked.lock().unwrap().insert(name.to_string());
        let mut reads = self.reads.lock().unwrap();
        reads.insert(name.to_string());
        // Reading one name of a tied group reads the tensor every name of it stands for.
        if let Some(group) = self.aliases.iter().find(|g| g.iter().any(|n| n == name)) {
            reads.extend(group.iter().cloned());
        }
        Ok(var)
    }
}

/// A weight as the port gets it while golden times it (`run/speed.rs`): not a `Var` — a port
/// loaded from a checkpoint computes on plain tensors, and candle records the graph of every
/// operation on a `Var` (for a backward pass), which would count against the port.
fn timed(t: Tensor) -> candle_core::Result<Tensor> {
    Ok(if crate::judge::speed::running() {
        t.detach()
    } else {
        t
    })
}

impl SimpleBackend for Backend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        crate::judge::speed::serving(|| {
            timed(
                self.0
                    .lookup(name, Some(&s))?
                    .to_device(dev)?
                    .to_dtype(dtype)?,
            )
        })
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        crate::judge::speed::serving(|| {
            timed(self.0.lookup(name, None)?.to_device(dev)?.to_dtype(dtype)?)
        })
    }

    fn contains_tensor(&self, name: &str) -> bool {
        // A tied name the checkpoint does not hold is not there, as in the real file: a port that
        // asks first (candle-transformers' Qwen2 does, for `lm_head.weight`) takes its tied path.
        self.0.tensors.contains_key(name) && !self.0.unsaved.lock().unwrap().contains(name)
    }
}

fn close_names(name: &str, names: &[String]) -> Vec<String> {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    let prefix = name.rsplit_once('.').map(|(p, _)| p).unwrap_or("");
    let mut close: Vec<String> = names
        .iter()
        .filter(|n| {
            let (p, l) = n.rsplit_once('.').unwrap_or(("", n.as_str()));
            p == prefix || l == leaf
        })
        .cloned()
        .collect();
    if close.is_empty() {
        close = names.to_vec();
    }
    close.truncate(8);
    close
}

/// `issues` without the entries the port never read that it may leave unread: those kept as the
/// module has them (`kept`, by the reference's names; a port may compute them itself), under their
/// served names (`rename`).
pub fn without_kept(
    issues: Vec<ParamIssue>,
    kept: &[String],
    rename: &[(String, String)],
) -> Vec<ParamIssue> {
    issues
        .into_iter()
        .filter(|i| match i {
            ParamIssue::Unused { name, .. } => !kept.iter().any(|k| renamed(k, rename) == *name),
            _ => true,
        })
        .collect()
}

/// The port's name for a reference name under `rename(from = to, ...)`: the first rule whose
/// `from` prefixes the name replaces that prefix.
pub fn renamed(name: &str, rename: &[(String, String)]) -> String {
    for (from, to) in rename {
        if let Some(rest) = name.strip_prefix(from.as_str()) {
            return format!("{to}{rest}");
        }
    }
    name.to_string()
}

impl StateDict {
    /// Hold the reference's entries as `Var`s of the case dtype on `device`.
    pub fn new(
        entries: &[(String, HostTensor)],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        Self::serve(entries, &[], &[], dtype, device)
    }

    /// Hold the reference's entries as `Var`s, served under the port's names (`rename`), with
    /// each group of tied names (`aliases`, the reference's names) one `Var`: gradients through
    /// any of its names add up, as they do in PyTorch.
    pub fn serve(
        entries: &[(String, HostTensor)],
        aliases: &[Vec<String>],
        rename: &[(String, String)],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let names: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
        Self::serve_made(&names, aliases, rename, dtype, device, |k| {
            Var::from_tensor(&entries[k].1.to_candle(device)?)
        })
    }

    /// [`StateDict::serve`] with the entry of each name made by `make(index)` (called once per
    /// tied group, for its first name): a caller that serves the same entries many times keeps
    /// them in the form cheapest to copy.
    pub(crate) fn serve_made(
        names: &[String],
        aliases: &[Vec<String>],
        rename: &[(String, String)],
        dtype: DType,
        device: &Device,
        mut make: impl FnMut(usize) -> candle_core::Result<Var>,
    ) -> candle_core::Result<Self> {
        let map = VarMap::new();
        let served = |n: &str| renamed(n, rename);
        let aliases: Vec<Vec<String>> = aliases
            .iter()
            .map(|g| g.iter().map(|n| served(n)).collect())
            .collect();
        {
            let mut data = map.data().lock().unwrap();
            for (k, name) in names.iter().enumerate() {
                let name = served(name);
                let tied = aliases
                    .iter()
                    .find(|g| g.contains(&name))
                    .and_then(|g| g.iter().find_map(|n| data.get(n).cloned()));
                let var = match tied {
                    Some(var) => var,
                    None => make(k)?,
                };
                data.insert(name, var);
            }
        }
        let tensors = map
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        Ok(StateDict {
            inner: Arc::new(Tracked {
                tensors,
                map,
                names: names.iter().map(|n| served(n)).collect(),
                renamed: names
                    .iter()
                    .filter(|n| served(n) != **n)
                    .map(|n| (served(n), n.clone()))
                    .collect(),
                aliases,
                reads: Mutex::new(BTreeSet::new()),
                asked: Mutex::new(BTreeSet::new()),
                unsaved: Mutex::new(BTreeSet::new()),
                issues: Mutex::new(Vec::new()),
            }),
            dtype,
            device: device.clone(),
        })
    }

    /// A checkpoint's state served as plain tensors: `made`, one per entry of `entries` (the
    /// state_dict's names), made once per process and dtype by the checkpoint and shared by every
    /// case (`answers/checkpoint.rs`, `Resolved::port_tensors`): a forward check reads them and
    /// never trains them, so no case copies them (a whole model's checkpoint is gigabytes).
    pub fn shared(
        made: Arc<Vec<Tensor>>,
        entries: &[(String, HostTensor)],
        aliases: &[Vec<String>],
        rename: &[(String, String)],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        if made.len() != entries.len() {
            candle_core::bail!(
                "the checkpoint's tensors ({}) do not match the state_dict ({} entries)",
                made.len(),
                entries.len()
            );
        }
        let names: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
        let served = |n: &str| renamed(n, rename);
        let aliases: Vec<Vec<String>> = aliases
            .iter()
            .map(|g| g.iter().map(|n| served(n)).collect())
            .collect();
        let mut tensors = std::collections::HashMap::new();
        for (name, t) in names.iter().zip(made.iter()) {
            let name = served(name);
            let tied = aliases
                .iter()
                .find(|g| g.contains(&name))
                .and_then(|g| g.iter().find_map(|n| tensors.get(n).cloned()));
            tensors.insert(name, tied.unwrap_or_else(|| t.clone()));
        }
        Ok(StateDict {
            inner: Arc::new(Tracked {
                tensors,
                map: VarMap::new(),
                names: names.iter().map(|n| served(n)).collect(),
                renamed: names
                    .iter()
                    .filter(|n| served(n) != **n)
                    .map(|n| (served(n), n.clone()))
                    .collect(),
                aliases,
                reads: Mutex::new(BTreeSet::new()),
                asked: Mutex::new(BTreeSet::new()),
                unsaved: Mutex::new(BTreeSet::new()),
                issues: Mutex::new(Vec::new()),
            }),
            dtype,
            device: device.clone(),
        })
    }

    /// A `VarBuilder` over the entries; every request is recorded.
    pub fn var_builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(
            Box::new(Backend(Arc::clone(&self.inner))),
            self.dtype,
            self.device.clone(),
        )
    }

    /// The `Var` behind a reference name (under its served name, with `rename`).
    pub fn var(&self, reference_name: &str) -> Option<Var> {
        let data = self.inner.map.data().lock().unwrap();
        let served = self
            .inner
            .renamed
            .iter()
            .find(|(_, r)| *r == reference_name)
            .map(|(s, _)| s.as_str())
            .unwrap_or(reference_name);
        data.get(served).cloned()
    }

    /// Every entry's `Var` once, by the reference's name, in state_dict order (a tied group by
    /// its first name): what an optimizer trains.
    pub fn vars(&self) -> Vec<(String, Var)> {
        let data = self.inner.map.data().lock().unwrap();
        let mut seen: Vec<&Var> = Vec::new();
        let mut out = Vec::new();
        for name in &self.inner.names {
            let var = &data[name];
            if seen
                .iter()
                .any(|v| v.as_tensor().id() == var.as_tensor().id())
            {
                continue;
            }
            seen.push(var);
            let reference = self.inner.renamed.get(name).unwrap_or(name);
            out.push((reference.clone(), var.clone()));
        }
        out
    }

    /// The `VarMap` holding the entries, under the served names.
    pub fn var_map(&self) -> &VarMap {
        &self.inner.map
    }

    /// Problems met while the port built itself (missing names, wrong shapes).
    pub fn request_issues(&self) -> Vec<ParamIssue> {
        self.inner.issues.lock().unwrap().clone()
    }

    /// Tell the VarBuilder which names (the reference's) a checkpoint of the module does not hold:
    /// `contains_tensor` answers no for them, reading one is still served (and reported by
    /// [`Self::unsaved_reads`]).
    pub fn not_in_checkpoints(&self, unsaved: &[String]) {
        let mut set = self.inner.unsaved.lock().unwrap();
        for n in unsaved {
            let served = self
                .inner
                .renamed
                .iter()
                .find(|(_, reference)| reference.as_str() == n)
                .map_or(n.clone(), |(port, _)| port.clone());
            set.insert(served);
        }
    }

    /// Names the port read that a checkpoint of the module does not hold (`unsaved`, the
    /// reference's names), each with the name of its tensor that one does.
    pub fn unsaved_reads(&self, unsaved: &[String]) -> Vec<ParamIssue> {
        let asked = self.inner.asked.lock().unwrap();
        let served = |n: &str| {
            self.inner
                .renamed
                .iter()
                .find(|(_, reference)| reference.as_str() == n)
                .map_or(n.to_string(), |(port, _)| port.clone())
        };
        unsaved
            .iter()
            .map(|n| served(n))
            .filter(|n| asked.contains(n))
            .filter_map(|n| {
                let group = self.inner.aliases.iter().find(|g| g.contains(&n))?;
                let saved = group
                    .iter()
                    .find(|m| !unsaved.iter().any(|u| served(u) == **m))?;
                Some(ParamIssue::Unsaved {
                    name: n.clone(),
                    saved: saved.clone(),
                })
            })
            .collect()
    }

    /// The names of the entries the port never read (every name of a tied group).
    pub fn unused_names(&self) -> Vec<String> {
        let reads = self.inner.reads.lock().unwrap();
        self.inner
            .names
            .iter()
            .filter(|n| !reads.contains(*n))
            .cloned()
            .collect()
    }

    /// Entries the port never read, in state_dict order (a tied group once, by its first name).
    pub fn unused(&self) -> Vec<ParamIssue> {
        let reads = self.inner.reads.lock().unwrap();
        let data = &self.inner.tensors;
        let mut reported: Vec<&str> = Vec::new();
        let mut out = Vec::new();
        for n in &self.inner.names {
            if reads.contains(n) || NEVER_READ_OK.iter().any(|ok| n.ends_with(ok)) {
                continue;
            }
            let group = self.inner.aliases.iter().find(|g| g.contains(n));
            if group.is_some_and(|g| g.iter().any(|m| reported.contains(&m.as_str()))) {
                continue;
            }
            reported.push(n);
            let beside = n
                .rsplit_once('.')
                .map_or_else(|| "weight".to_string(), |(p, _)| format!("{p}.weight"));
            out.push(ParamIssue::Unused {
                name: n.clone(),
                shape: data[n].dims().to_vec(),
                weight: data.get(&beside).map(|t| t.dims().to_vec()),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::inputs::float_tensor;

    fn state() -> StateDict {
        let w = float_tensor(vec![4, 3], &[0.5; 12], DType::F32);
        let b = float_tensor(vec![4], &[0.1; 4], DType::F32);
        StateDict::new(
            &[("fc.weight".into(), w), ("fc.bias".into(), b)],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    }

    #[test]
    fn a_linear_without_bias_leaves_the_bias_unused() {
        let sd = state();
        candle_nn::linear_no_bias(3, 4, sd.var_builder().pp("fc")).unwrap();
        assert!(sd.request_issues().is_empty());
        let unused = sd.unused();
        assert_eq!(unused.len(), 1);
        assert!(
            unused[0].to_string().contains("`fc.bias` [4]"),
            "{}",
            unused[0]
        );
        assert!(unused[0].to_string().contains("forgotten bias"));
    }

    #[test]
    fn a_transposed_weight_names_both_shapes() {
        let sd = state();
        let err = sd.var_builder().pp("fc").get((3, 4), "weight").unwrap_err();
        assert!(err.to_string().contains("[3, 4]"), "{err}");
        let issues = sd.request_issues();
        let text = issues[0].to_string();
        assert!(
            text.contains("[3, 4]") && text.contains("[4, 3]") && text.contains("transposed"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_name_lists_the_neighbours() {
        let sd = state();
        let _ = sd.var_builder().pp("fc").get(4, "gamma");
        let text = sd.request_issues()[0].to_string();
        assert!(
            text.contains("`fc.gamma`") && text.contains("fc.weight, fc.bias"),
            "{text}"
        );
    }

    #[test]
    fn weights_read_through_the_builder_carry_gradients() {
        let sd = state();
        let lin = candle_nn::linear(3, 4, sd.var_builder().pp("fc")).unwrap();
        let x = Tensor::ones((2, 3), DType::F32, &Device::Cpu).unwrap();
        let y = candle_nn::Module::forward(&lin, &x)
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = y.backward().unwrap();
        let w = sd.var_map().data().lock().unwrap()["fc.weight"].clone();
        assert!(grads.get(w.as_tensor()).is_some());
    }
}
