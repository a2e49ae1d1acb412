//! The reference as a check sees it: given a case's inputs, its outputs (and, in module form, the
//! state_dict the port must use). Live, this is one request to a pooled Python worker.

use crate::describe::env;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::judge::compare;
use crate::python::key::WorkerKey;
use crate::python::wire::{self, TensorTable};
use crate::python::worker::{pool, WorkerError};
use candle_core::DType;
use golden_files::HostTensor;
use serde_json::{json, Map, Value as Json};
use std::time::Duration;

/// Named tensors, in the reference's order.
pub type Named = Vec<(String, HostTensor)>;

/// What the reference produced for one case.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceOutputs {
    /// Module form: the module's state_dict in the case dtype (empty in function form).
    pub state_dict: Named,
    /// Module form: which state_dict entries are buffers, not parameters (no gradient in PyTorch).
    pub buffers: Vec<String>,
    /// Outputs in the case dtype.
    pub expected: Named,
    /// Per float leaf, the rounding estimate (None if the reference could not run in float64).
    pub rounding: Option<Named>,
    /// Why there is no rounding estimate.
    pub precise_error: Option<String>,
}

impl ReferenceOutputs {
    /// The rounding estimate of a leaf, if there is one.
    pub fn rounding_of(&self, leaf: &str) -> Option<&HostTensor> {
        let set = self.rounding.as_ref()?;
        set.iter().find(|(n, _)| n == leaf).map(|(_, t)| t)
    }

    /// Compare a port's outputs with these, leaf by leaf (`compare.rs`), allowing `factor` times
    /// the rounding estimate.
    pub fn compare(
        &self,
        port: &[(String, HostTensor)],
        tol: Option<crate::describe::layer::Tol>,
        factor: f64,
    ) -> Vec<compare::Leaf> {
        let expected: Vec<(String, compare::Expected<'_>)> = self
            .expected
            .iter()
            .map(|(name, value)| {
                let rounding = self.rounding_of(name);
                (name.clone(), compare::Expected { value, rounding })
            })
            .collect();
        compare::compare_all(port, &expected, tol, factor)
    }
}

/// The rounding error float arithmetic in the case dtype is expected to make at each element of a
/// leaf: the larger of the reference's own error at the real inputs (`|expected − precise|`) and
/// the worker's estimate from inputs nudged by one ulp (the RMS over four nudges of the reference's
/// error there and of the float64 output's move; `reference_py/golden_ref/evaluate.py`).
///
/// Several samples matter: one sample of a zero-mean error is sometimes tiny by chance; with a single
/// nudge the zoo's correct `linear` at inputs of ~100 needed 205× its estimate at its worst element,
/// with four 7.5×. The estimate is kept as bf16 rounded up: a tolerance scale needs no more digits,
/// and live runs and replays of the golden store then use bit-identical tolerances.
pub fn rounding_estimate(
    expected: &HostTensor,
    precise: &HostTensor,
    nudged: Option<&HostTensor>,
) -> HostTensor {
    let e = expected.to_f64();
    let h = precise.to_f64();
    let s = nudged
        .map(HostTensor::to_f64)
        .filter(|s| s.len() == e.len());
    let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
    let estimate: Vec<u8> = (0..e.len())
        .map(|i| {
            let own = h.get(i).map_or(0.0, |h| finite((e[i] - h).abs()));
            let moved = s.as_ref().map_or(0.0, |s| finite(s[i]));
            bf16_round_up(own.max(moved))
        })
        .flat_map(half::bf16::to_le_bytes)
        .collect();
    HostTensor {
        dtype: golden_files::WireDType::BF16,
        shape: expected.shape.clone(),
        data: estimate.into(),
    }
}

/// The smallest bf16 not below `x` (x ≥ 0).
fn bf16_round_up(x: f64) -> half::bf16 {
    let b = half::bf16::from_f64(x);
    if b.to_f64() < x {
        half::bf16::from_bits(b.to_bits() + 1)
    } else {
        b
    }
}

/// What one known variant of the reference gave on a case.
#[derive(Clone, Debug)]
pub struct VariantOutputs {
    /// Its name, e.g. `gelu(approximate='tanh')`.
    pub name: String,
    /// The fix to print when the port matches it.
    pub fix: String,
    /// Its outputs and their rounding estimate, as for the reference (None when it raised).
    pub outputs: Option<ReferenceOutputs>,
}

/// Rounding-sized nudges per case (the estimate is the largest response).
const PERTURBATIONS: u32 = 4;

/// A live reference: requests go to the worker pool.
pub struct Live {
    key: WorkerKey,
    timeout: Duration,
}

fn json_map(values: &[(String, crate::describe::layer::Value)]) -> Json {
    Json::Object(
        values
            .iter()
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect::<Map<_, _>>(),
    )
}

impl Live {
    /// A live reference for a layer, with the interpreter and roots from the environment.
    pub fn new(layer: &Layer) -> Result<Self, String> {
        Ok(Live {
            key: WorkerKey::from_env(layer.manifest_dir()),
            timeout: match layer.timeout {
                Some(t) => t,
                None => env::timeout()?,
            },
        })
    }

    /// The interpreter and import roots in use.
    pub fn key(&self) -> &WorkerKey {
        &self.key
    }

    /// How long the reference may take on one request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Start (or reuse) a worker and resolve the reference: the errors a user fixes once
    /// (interpreter, imports, a misspelt callable) surface here, before any case runs. Returns the
    /// versions of Python, NumPy and the backend.
    pub fn load(&self, layer: &Layer) -> Result<Json, WorkerError> {
        let mut worker = pool().check_out(&self.key)?;
        let during = format!("importing `{}`", layer.reference);
        let (loaded, _) = worker.request(
            json!({
                "op": "load",
                "reference": layer.reference,
                "form": layer.form.as_str(),
                "backend": layer.backend.as_str(),
            }),
            Vec::new(),
            self.timeout.max(Duration::from_secs(180)),
            &during,
        )?;
        let mut versions = worker.info.clone();
        if let (Some(all), Some(backend)) = (versions.as_object_mut(), loaded.as_object()) {
            all.extend(
                backend
                    .iter()
                    .filter(|(k, _)| *k != "ok")
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        Ok(versions)
    }

    /// Evaluate the reference's known variants (`golden_ref.variants`) on one case.
    pub fn variants(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
    ) -> Result<Vec<VariantOutputs>, WorkerError> {
        let mut table = TensorTable::default();
        let mut header = self.header(layer, dtype, seed, args, &mut table);
        header["op"] = json!("variants");
        let mut worker = pool().check_out(&self.key)?;
        let (response, tensors) = worker.request(
            header,
            table.tensors,
            self.timeout,
            "evaluating the reference's variants",
        )?;
        let protocol = |e: wire::WireError| WorkerError::Protocol(e.to_string());
        response["variants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let outputs = match &v["outputs"] {
                    Json::Null => None,
                    o => Some(decode_outputs(o, &tensors).map_err(protocol)?),
                };
                Ok(VariantOutputs {
                    name: v["name"].as_str().unwrap_or("?").to_string(),
                    fix: v["fix"].as_str().unwrap_or_default().to_string(),
                    outputs,
                })
            })
            .collect()
    }

    pub(crate) fn header(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
        table: &mut TensorTable,
    ) -> Json {
        let arg_refs: Vec<Json> = args.iter().map(|a| table.add(a.clone())).collect();
        json!({
            "op": "forward",
            "reference": layer.reference,
            "form": layer.form.as_str(),
            "backend": layer.backend.as_str(),
            "seed": seed,
            "dtype": dtype_name(dtype),
            "args": arg_refs,
            "kwargs": json_map(&layer.consts),
            "init": json_map(&layer.init),
            "perturbations": PERTURBATIONS,
        })
    }

    /// Ask the reference for what `request` needs on one case.
    pub fn request(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        request: &Request<'_>,
        during: &str,
    ) -> Result<ReferenceOutputs, WorkerError> {
        let mut table = TensorTable::default();
        let mut header = match request {
            Request::Forward { args, trace } => {
                let mut h = self.header(layer, dtype, seed, args, &mut table);
                if *trace {
                    h["trace"] = json!(true);
                }
                h
            }
            Request::Gradients {
                args,
                cotangents,
                names,
                wrt,
                params,
            } => {
                let all: Vec<HostTensor> = args.iter().chain(cotangents.iter()).cloned().collect();
                let mut h = self.header(layer, dtype, seed, &all, &mut table);
                h["op"] = json!("gradients");
                h["names"] = json!(names);
                h["wrt"] = json!(wrt);
                h["params"] = json!(params);
                h
            }
            Request::Train {
                args,
                targets,
                loss,
                optimizer,
                steps,
            } => {
                let mut h = self.header(layer, dtype, seed, args, &mut table);
                h["op"] = json!("train");
                h["targets"] = Json::Array(targets.iter().map(|t| table.add(t.clone())).collect());
                h["loss"] = json!(loss);
                h["optimizer"] = (*optimizer).clone();
                h["steps"] = json!(steps);
                h
            }
        };
        if let Some(object) = header.as_object_mut() {
            object.retain(|_, v| !v.is_null());
        }
        let mut worker = pool().check_out(&self.key)?;
        let (response, tensors) = worker.request(header, table.tensors, self.timeout, during)?;
        let protocol = |e: wire::WireError| WorkerError::Protocol(e.to_string());
        match request {
            Request::Forward { .. } => decode_outputs(&response, &tensors).map_err(protocol),
            Request::Gradients { .. } => {
                let mut outputs = decode_outputs(&response, &tensors).map_err(protocol)?;
                // The worker names gradients like outputs (`out.x`); they are `grad.x` here.
                let rename = |set: &mut Named| {
                    for (name, _) in set.iter_mut() {
                        *name = format!("grad.{}", name.strip_prefix("out.").unwrap_or(name));
                    }
                };
                rename(&mut outputs.expected);
                if let Some(r) = outputs.rounding.as_mut() {
                    rename(r);
                }
                Ok(outputs)
            }
            Request::Train { .. } => {
                let losses: Vec<f64> = response["losses"]
                    .as_array()
                    .map(|l| l.iter().filter_map(Json::as_f64).collect())
                    .unwrap_or_default();
                let mut expected = vec![(
                    "losses".to_string(),
                    HostTensor::from_f64(vec![losses.len()], &losses),
                )];
                for (name, t) in named(&response["final"], &tensors)
                    .map_err(protocol)?
                    .unwrap_or_default()
                {
                    expected.push((format!("final.{name}"), t));
                }
                Ok(ReferenceOutputs {
                    state_dict: Vec::new(),
                    buffers: Vec::new(),
                    expected,
                    rounding: None,
                    precise_error: None,
                })
            }
        }
    }
}

/// What a check asks of the reference for one case.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    /// Its outputs on `args` (and, in module form, its state_dict).
    Forward {
        /// The inputs.
        args: &'a [HostTensor],
        /// Module form: also every submodule's output, as leaves `trace.<name>` in execution
        /// order (the forward check of a layer with `trace`).
        trace: bool,
    },
    /// PyTorch's gradients of `Σ sum(out · cotangent)` with respect to the inputs `wrt` (by
    /// index) and, with `params`, the module's parameters; leaves named `grad.<name>`.
    Gradients {
        /// The inputs.
        args: &'a [HostTensor],
        /// One per output leaf, in the reference's order.
        cotangents: &'a [HostTensor],
        /// The inputs' names.
        names: &'a [String],
        /// Which inputs to differentiate.
        wrt: &'a [usize],
        /// Whether to differentiate the module's parameters too.
        params: bool,
    },
    /// The overfit check's training steps: leaves `losses` (f64, one per step) and
    /// `final.<parameter>`.
    Train {
        /// The batch.
        args: &'a [HostTensor],
        /// One target per output leaf.
        targets: &'a [HostTensor],
        /// `mse` or `cross_entropy`.
        loss: &'a str,
        /// The optimizer as the worker reads it.
        optimizer: &'a Json,
        /// Number of steps.
        steps: u32,
    },
}

impl Request<'_> {
    /// Everything beyond the layer, the dtype and the seed that the answer depends on: a text and
    /// the tensors (for the golden store's key).
    pub fn key_parts(&self) -> (String, Vec<&HostTensor>) {
        match *self {
            Request::Forward { args, trace } => (
                if trace { "trace".into() } else { String::new() },
                args.iter().collect(),
            ),
            Request::Gradients {
                args,
                cotangents,
                names,
                wrt,
                params,
            } => (
                format!("gradients {names:?} {wrt:?} {params}"),
                args.iter().chain(cotangents).collect(),
            ),
            Request::Train {
                args,
                targets,
                loss,
                optimizer,
                steps,
            } => (
                format!("train {loss} {optimizer} {steps}"),
                args.iter().chain(targets).collect(),
            ),
        }
    }
}

/// A JSON list of strings (an absent one is empty).
pub(crate) fn strings(value: &Json) -> Vec<String> {
    value
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn named(value: &Json, tensors: &[HostTensor]) -> Result<Option<Named>, wire::WireError> {
    let Some(items) = value.as_array() else {
        return Ok(None);
    };
    items
        .iter()
        .map(|item| {
            let name = item.get(0).and_then(Json::as_str).ok_or_else(|| {
                wire::WireError::Malformed(format!("expected [name, tensor], got {item}"))
            })?;
            let tensor = wire::tensor_ref(&item[1], tensors)?;
            Ok((name.to_string(), tensor.clone()))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

pub(crate) fn decode_outputs(
    header: &Json,
    tensors: &[HostTensor],
) -> Result<ReferenceOutputs, wire::WireError> {
    let expected = named(&header["expected"], tensors)?
        .ok_or_else(|| wire::WireError::Malformed("an answer without `expected`".into()))?;
    let precise = named(&header["precise"], tensors)?;
    let nudged = named(&header["rounding"], tensors)?;
    let find =
        |set: &Named, name: &str| set.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone());
    let rounding = precise.map(|precise| {
        expected
            .iter()
            .filter_map(|(name, value)| {
                let h = find(&precise, name)?;
                let s = nudged.as_ref().and_then(|n| find(n, name));
                Some((name.clone(), rounding_estimate(value, &h, s.as_ref())))
            })
            .collect()
    });
    Ok(ReferenceOutputs {
        state_dict: named(&header["state_dict"], tensors)?.unwrap_or_default(),
        buffers: strings(&header["buffers"]),
        expected,
        rounding,
        precise_error: header["precise_error"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_rounds_up_to_bf16() {
        for x in [0.0, 1e-30, 3.3e-7, 1.0, 1.001, 12345.678] {
            let b = bf16_round_up(x).to_f64();
            assert!(b >= x && b <= x * (1.0 + 2f64.powi(-7)), "{x} -> {b}");
        }
    }
}
