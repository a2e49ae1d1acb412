//! The reference as a check sees it: given a case's inputs, its outputs (and, in module form, the
//! state_dict the port must use). Live, this is one request to a pooled Python worker.

use crate::env;
use crate::layer::Layer;
use crate::wire::{self, HostTensor, TensorTable};
use crate::worker::{pool, WorkerError, WorkerKey};
use candle_core::DType;
use serde_json::{json, Map, Value as Json};
use std::time::Duration;

/// Named tensors, in the reference's order.
pub type Named = Vec<(String, HostTensor)>;

/// What the reference produced for one case.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceOutputs {
    /// Module form: the module's state_dict in the case dtype (empty in function form).
    pub state_dict: Named,
    /// Outputs in the case dtype.
    pub expected: Named,
    /// The same computation in float64 (None if the reference could not run in float64).
    pub precise: Option<Named>,
    /// Per float leaf: how far the float64 output moves under rounding-sized nudges of the inputs.
    pub rounding: Option<Named>,
    /// Why `precise` is missing.
    pub precise_error: Option<String>,
}

/// Rounding-sized nudges per case (the estimate is the largest response).
const PERTURBATIONS: u32 = 4;

/// The short name of a float dtype on the wire.
pub fn dtype_name(dtype: DType) -> &'static str {
    wire::WireDType::from_candle(dtype)
        .map(wire::WireDType::name)
        .unwrap_or("?")
}

/// A live reference: requests go to the worker pool.
pub struct Live {
    key: WorkerKey,
    timeout: Duration,
}

fn json_map(values: &[(String, crate::layer::Value)]) -> Json {
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
            key: WorkerKey::from_env(layer.manifest_dir),
            timeout: env::timeout()?,
        })
    }

    /// The interpreter and import roots in use.
    pub fn key(&self) -> &WorkerKey {
        &self.key
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

    /// Run the reference on one case.
    pub fn forward(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
        during: &str,
    ) -> Result<ReferenceOutputs, WorkerError> {
        let mut table = TensorTable::default();
        let arg_refs: Vec<Json> = args.iter().map(|a| table.add(a.clone())).collect();
        let header = json!({
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
        });
        let mut worker = pool().check_out(&self.key)?;
        let (response, tensors) = worker.request(header, table.tensors, self.timeout, during)?;
        decode_outputs(&response, &tensors).map_err(|e| WorkerError::Protocol(e.to_string()))
    }
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

fn decode_outputs(
    header: &Json,
    tensors: &[HostTensor],
) -> Result<ReferenceOutputs, wire::WireError> {
    Ok(ReferenceOutputs {
        state_dict: named(&header["state_dict"], tensors)?.unwrap_or_default(),
        expected: named(&header["expected"], tensors)?
            .ok_or_else(|| wire::WireError::Malformed("an answer without `expected`".into()))?,
        precise: named(&header["precise"], tensors)?,
        rounding: named(&header["rounding"], tensors)?,
        precise_error: header["precise_error"].as_str().map(str::to_string),
    })
}
