//! Module form: the reference module's `state_dict()` served to the port through a `VarBuilder`.
//!
//! The tensors live in a `VarMap` (as `Var`s, so gradients w.r.t. them work), behind a backend that
//! remembers what the port asked for. `VarBuilder::from_varmap` would silently *create* a weight the
//! reference lacks; this backend instead records each problem — a name the module does not have, a
//! shape that differs (a transposed Linear weight), an entry the port never reads (a forgotten
//! bias) — so the failure names every one of them.

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{VarBuilder, VarMap};
use golden_files::HostTensor;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

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
    },
}

impl fmt::Display for ParamIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamIssue::Missing { name, shape, close } => {
                write!(
                    f,
                    "the port asks for `{name}` {shape:?}, which the reference module does not have"
                )?;
                if !close.is_empty() {
                    write!(f, " (it has: {})", close.join(", "))?;
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
            ParamIssue::Unused { name, shape } => {
                write!(
                    f,
                    "the reference's state_dict has `{name}` {shape:?}, which the port never reads"
                )?;
                if name.ends_with("bias") {
                    write!(
                        f,
                        " — a forgotten bias? (candle_nn::linear_no_bias drops it)"
                    )?;
                }
                Ok(())
            }
        }
    }
}

struct Tracked {
    map: VarMap,
    names: Vec<String>,
    reads: Mutex<BTreeSet<String>>,
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
        let var = self.map.data().lock().unwrap().get(name).cloned();
        let Some(var) = var else {
            let close = close_names(name, &self.names);
            let issue = ParamIssue::Missing {
                name: name.to_string(),
                shape: wanted.map(|s| s.dims().to_vec()).unwrap_or_default(),
                close,
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
        self.reads.lock().unwrap().insert(name.to_string());
        Ok(var.as_tensor().clone())
    }
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
        self.0
            .lookup(name, Some(&s))?
            .to_device(dev)?
            .to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.0.lookup(name, None)?.to_device(dev)?.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.map.data().lock().unwrap().contains_key(name)
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

impl StateDict {
    /// Hold the reference's entries as `Var`s of the case dtype on `device`.
    pub fn new(
        entries: &[(String, HostTensor)],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let map = VarMap::new();
        {
            let mut data = map.data().lock().unwrap();
            for (name, t) in entries {
                data.insert(name.clone(), Var::from_tensor(&t.to_candle(device)?)?);
            }
        }
        Ok(StateDict {
            inner: Arc::new(Tracked {
                map,
                names: entries.iter().map(|(n, _)| n.clone()).collect(),
                reads: Mutex::new(BTreeSet::new()),
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

    /// The `VarMap` holding the entries (its `Var`s are what an optimizer would train).
    pub fn var_map(&self) -> &VarMap {
        &self.inner.map
    }

    /// Problems met while the port built itself (missing names, wrong shapes).
    pub fn request_issues(&self) -> Vec<ParamIssue> {
        self.inner.issues.lock().unwrap().clone()
    }

    /// Entries the port never read, in state_dict order.
    pub fn unused(&self) -> Vec<ParamIssue> {
        let reads = self.inner.reads.lock().unwrap();
        let data = self.inner.map.data().lock().unwrap();
        self.inner
            .names
            .iter()
            .filter(|n| !reads.contains(*n))
            .filter(|n| !NEVER_READ_OK.iter().any(|ok| n.ends_with(ok)))
            .map(|n| ParamIssue::Unused {
                name: n.clone(),
                shape: data[n].dims().to_vec(),
            })
            .collect()
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
