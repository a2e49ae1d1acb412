//! The reference's time on one case (`timing` requests; `reference_py/golden_ref/timing.py`): its
//! warm runs' times, a schedule's steps, a traced check's points, and how much the worker's
//! resident set rose, beside the port's (`run/speed.rs`). Live only: a golden store holds answers,
//! never timings (they vary from run to run), so a replay times the port alone.

use crate::answers::live::{add_schedule, Live, State};
use crate::answers::source::Source;
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::describe::schedule::Plan;
use crate::judge::speed::StepTime;
use crate::python::wire;
use crate::python::worker::WorkerError;
use candle_core::DType;
use golden_files::HostTensor;
use serde_json::{json, Value as Json};

/// What the worker measured of the reference on one case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceTiming {
    /// torch's intra-op threads (`None` for another backend).
    pub threads: Option<usize>,
    /// Each timed run's call, seconds.
    pub totals: Vec<f64>,
    /// A schedule: each timed run's steps.
    pub steps: Vec<Vec<StepTime>>,
    /// A traced check: each run's points (`trace.<name>`, seconds since the call began), in the
    /// order they ended.
    pub points: Option<Vec<Vec<(String, f64)>>>,
    /// How much the worker's resident set rose over the timed runs, bytes.
    pub peak_bytes: Option<u64>,
    /// Why the peak could not be measured, when it could not.
    pub memory: Option<String>,
}

/// What a timing request asks for besides the case.
#[derive(Clone, Copy, Debug)]
pub struct Runs {
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs.
    pub runs: usize,
    /// Also the trace points' times (a traced check), in runs of their own.
    pub points: bool,
}

impl Live {
    /// Time the reference on one case (`state`: its parameters, as for any request about it).
    #[allow(clippy::too_many_arguments)]
    pub fn timing(
        &self,
        layer: &Layer,
        dtype: DType,
        seed: u64,
        args: &[HostTensor],
        state: Option<State<'_>>,
        plan: Option<&Plan>,
        runs: Runs,
    ) -> Result<ReferenceTiming, WorkerError> {
        let mut table = wire::TensorTable::default();
        let mut header = self.header(layer, dtype, seed, args, state, &mut table);
        header["op"] = json!("timing");
        header["warmup"] = json!(runs.warmup);
        header["runs"] = json!(runs.runs);
        header["points"] = json!(runs.points);
        add_schedule(&mut header, plan, &mut table);
        if header["schedule"].is_object() {
            // The one-shot forward is the comparison's, not the model's use.
            header["schedule"]["oneshot"] = json!(false);
        }
        if let Some(object) = header.as_object_mut() {
            object.retain(|_, v| !v.is_null());
        }
        let (response, _) = self.send(
            header,
            table.tensors,
            state,
            self.timeout(),
            "timing the reference",
        )?;
        Ok(decode(&response))
    }
}

fn numbers(v: &Json) -> Vec<f64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Json::as_f64)
        .collect()
}

/// The worker's answer, read.
fn decode(response: &Json) -> ReferenceTiming {
    let steps = response["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|run| {
            run.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| {
                    Some(StepTime {
                        index: s[0].as_u64()? as usize,
                        len: s[1].as_u64()? as usize,
                        seconds: s[2].as_f64()?,
                    })
                })
                .collect()
        })
        .collect();
    let points = response["points"].as_array().map(|runs| {
        runs.iter()
            .map(|run| {
                run.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_f64()?)))
                    .collect()
            })
            .collect()
    });
    ReferenceTiming {
        threads: response["threads"].as_u64().map(|t| t as usize),
        totals: numbers(&response["totals"]),
        steps,
        points,
        peak_bytes: response["peak_bytes"].as_u64(),
        memory: response["memory"].as_str().map(str::to_string),
    }
}

impl Source {
    /// Time the reference on one case; `None` in replay (a store holds no timings).
    pub fn timing(
        &self,
        layer: &Layer,
        dtype: DType,
        params: &CaseParams,
        args: &[HostTensor],
        runs: Runs,
    ) -> Option<Result<ReferenceTiming, WorkerError>> {
        let live = self.live()?;
        let plan = params.plan(layer);
        let layer = &*params.layer(layer);
        let state = match self.module_state(layer, dtype, params) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        Some(live.timing(
            layer,
            dtype,
            params.seed,
            args,
            state.as_ref().map(|s| s.as_state()),
            plan.as_ref(),
            runs,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_read_run_by_run() {
        let t = decode(&json!({
            "threads": 1,
            "totals": [0.002, 0.003],
            "steps": [[[0, 5, 0.001], [1, 1, 0.0002]], [[0, 5, 0.0011], [1, 1, 0.0003]]],
            "points": [[["trace.a", 0.001], ["trace.b", 0.002]]],
            "peak_bytes": 4096,
            "memory": null,
        }));
        assert_eq!(t.threads, Some(1));
        assert_eq!(t.totals, [0.002, 0.003]);
        assert_eq!(t.steps[1][1].seconds, 0.0003);
        assert_eq!(t.points.unwrap()[0][1].0, "trace.b");
        assert_eq!((t.peak_bytes, t.memory), (Some(4096), None));
    }
}
