//! Timing a passing case on both sides: how fast and how big the port is beside its reference.
//!
//! Once a forward check's cases pass in a dtype, golden takes the largest of them (a schedule's
//! with decode steps first) and runs it again on each side, `WARMUP` untimed run first, then
//! `GOLDEN_SPEED` timed ones (default [`RUNS`]): the same inputs, the same parameters, the same
//! dtype. The reference's side is the worker's (`answers/timing.rs`, `golden_ref/timing.py`);
//! the port's is here:
//!
//! - **Threads.** torch runs on one intra-op thread in golden's worker; the port runs its timed
//!   calls inside a rayon pool of as many threads as the reference reports (candle computes on
//!   the current rayon pool), so that both sides compute on the same number of threads; the
//!   number candle would use by itself is reported beside it.
//! - **Time.** Each call of the port, less what golden's `VarBuilder` spends serving it weights
//!   (`judge/speed.rs`). The weights are served as plain tensors while timed, not as the `Var`s
//!   the checks use (candle would record every operation's graph on those).
//! - **Memory.** How much the test process's resident set rose over the timed runs: its peak
//!   (VmHWM, reset through `/proc/self/clear_refs`) minus the resident set before them, after
//!   glibc's `malloc_trim` gave free memory back. Other tests running in the same process at the
//!   same time add to it; timings of two checks of a process never overlap (one lock), but their
//!   other work does: `--test-threads=1` gives clean figures.
//!
//! Timings never go into a snapshot or a golden store (they vary from run to run): they go to
//! the results file (`report/results.rs`), which `golden report` and `cargo xtask zoo` show. In
//! replay only the port is timed.

use crate::answers::live::ReferenceOutputs;
use crate::answers::params::StateDict;
use crate::answers::source::Source;
use crate::answers::timing::{ReferenceTiming, Runs};
use crate::describe::inputs::{self, CaseParams};
use crate::describe::layer::{dtype_name, Layer};
use crate::describe::outputs::PortInputs;
use crate::describe::schedule::PortSchedule;
use crate::judge::speed::{self, Phase, Point, Side, Speed, Spread, StepTime};
use crate::run::port::{PortFailure, PortThread};
use candle_core::{DType, Device, Tensor};
use std::sync::{Arc, Mutex};

/// Untimed runs before the timed ones, on each side.
pub(crate) const WARMUP: usize = 1;

/// Timed runs on each side, unless `GOLDEN_SPEED` says otherwise.
pub const RUNS: usize = 5;

/// Timed runs on each side for a model at size (`answers::live::AT_SIZE` parameters and more),
/// where each run is a whole model's: at most this many, whatever `GOLDEN_SPEED` asks.
pub const AT_SIZE_RUNS: usize = 3;

/// Timings of two checks of a test process never overlap.
static TIMING: Mutex<()> = Mutex::new(());

/// What the port's timed runs measured.
struct PortTimed {
    totals: Vec<f64>,
    /// Each run's taps (`trace.<name>`, numbered as the trace numbers them).
    marks: Vec<Vec<(String, f64)>>,
    steps: Vec<Vec<StepTime>>,
    peak_bytes: Option<u64>,
    memory: Option<String>,
}

/// Time the port and the reference on one passing case: `reference` is the answer the case
/// passed against (its parameters, a schedule's tokens). `Err` says why the case could not be
/// timed.
pub(crate) fn measure(
    layer: &Layer,
    dtype: DType,
    params: &CaseParams,
    port: &PortThread,
    source: &Source,
    reference: &ReferenceOutputs,
    runs: usize,
) -> Result<Speed, String> {
    let _serial = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let started = std::time::Instant::now();
    if layer.steps.is_some() {
        return Err("a step loop (`steps(...)`) is not timed yet".into());
    }
    let args = inputs::make_args(layer, params, dtype)?;
    let mut notes = Vec::new();
    // A whole model at size: each run is a whole model's, on both sides.
    let elements: usize = reference.state_dict.iter().map(|(_, t)| t.numel()).sum();
    let runs = if elements >= crate::answers::live::AT_SIZE && runs > AT_SIZE_RUNS {
        notes.push(format!(
            "a model at size ({elements} parameters): {AT_SIZE_RUNS} timed runs on each side"
        ));
        AT_SIZE_RUNS
    } else {
        runs
    };
    let asked = Runs {
        warmup: WARMUP,
        runs,
        points: layer.trace,
    };
    let theirs = match source.timing(layer, dtype, params, &args, asked) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            notes.push(format!(
                "the reference could not be timed: {}",
                e.to_string().lines().next().unwrap_or_default()
            ));
            None
        }
        None => {
            notes.push(
                "a replay: the reference is not timed (a golden store holds no timings)".into(),
            );
            None
        }
    };
    if let Some(why) = theirs.as_ref().and_then(|t| t.memory.clone()) {
        notes.push(format!("the reference's memory: {why}"));
    }
    let threads = theirs.as_ref().and_then(|t| t.threads).unwrap_or(1);
    let device = Device::Cpu;
    let tensors = args
        .iter()
        .map(|a| a.to_candle(&device))
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(|e| format!("could not build the port's inputs: {e}"))?;
    let state = crate::answers::source::port_state(layer, dtype, reference, &device)
        .map_err(|e| format!("could not serve the port its parameters: {e}"))?;
    port.enter_case(params);
    let schedule = crate::run::schedule::port_schedule(layer, params, reference);
    let mine = match time_port(port, tensors, state.as_ref(), schedule, runs, threads) {
        Ok(Ok(timed)) => timed,
        Ok(Err(message)) => return Err(format!("the port failed while timed: {message}")),
        Err(fault) => {
            return Err(match fault.stuck {
                Some(_) => "the port did not return while timed".to_string(),
                None => format!("the port failed while timed: {}", fault.message),
            })
        }
    };
    if let Some(why) = &mine.memory {
        notes.push(format!("the port's memory: {why}"));
    }
    // A schedule's time is its steps' calls on both sides: the port's call also builds its model
    // (the reference's module is built before its clock starts), and each side drives the steps
    // its own way (golden's copies, masks and caches).
    let stepped = |runs: &[Vec<StepTime>], totals: &[f64]| -> Vec<f64> {
        if runs.iter().all(|r| !r.is_empty()) && !runs.is_empty() {
            runs.iter()
                .map(|r| r.iter().map(|s| s.seconds).sum())
                .collect()
        } else {
            totals.to_vec()
        }
    };
    let port_seconds =
        Spread::of(&stepped(&mine.steps, &mine.totals)).ok_or("the port's runs took no time")?;
    let reference_side = theirs.as_ref().and_then(|t| {
        Some(Side {
            seconds: Spread::of(&stepped(&t.steps, &t.totals))?,
            peak_bytes: t.peak_bytes,
            threads: t.threads,
        })
    });
    let points = match (&theirs, layer.trace) {
        (Some(t), true) => points(&mine.marks, t),
        _ => Vec::new(),
    };
    let (prefill, decode) = phases(&mine.steps, theirs.as_ref());
    Ok(Speed {
        dtype: dtype_name(dtype).to_string(),
        case: params.token(),
        warmup: WARMUP,
        port: Side {
            seconds: port_seconds,
            peak_bytes: mine.peak_bytes,
            threads: Some(threads),
        },
        reference: reference_side,
        port_default_threads: candle_core::utils::get_num_threads(),
        points,
        prefill,
        decode,
        notes,
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .to_string(),
        spent: started.elapsed().as_secs_f64(),
    })
}

/// The trace points both sides timed, in the reference's order, each side's time for each
/// ([`speed::point_times`]).
fn points(mine: &[Vec<(String, f64)>], theirs: &ReferenceTiming) -> Vec<Point> {
    let Some(reference_runs) = theirs.points.as_ref().filter(|r| !r.is_empty()) else {
        return Vec::new();
    };
    let (Some(port_first), Some(reference_first)) = (mine.first(), reference_runs.first()) else {
        return Vec::new();
    };
    let common: Vec<&str> = reference_first
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| port_first.iter().any(|(m, _)| m == n))
        .collect();
    let keep = |n: &str| common.contains(&n);
    let times = |runs: &[Vec<(String, f64)>]| -> Vec<Vec<(String, f64)>> {
        runs.iter().map(|r| speed::point_times(r, keep)).collect()
    };
    let (port_times, reference_times) = (times(mine), times(reference_runs));
    let spread = |runs: &[Vec<(String, f64)>], name: &str| {
        let samples: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.iter().find(|(n, _)| n == name).map(|(_, s)| *s))
            .collect();
        Spread::of(&samples)
    };
    common
        .iter()
        .filter_map(|name| {
            Some(Point {
                name: name
                    .strip_prefix(crate::judge::trace::PREFIX)
                    .unwrap_or(name)
                    .to_string(),
                depth: common
                    .iter()
                    .filter(|other| speed::inside(name, other))
                    .count(),
                port: spread(&port_times, name)?,
                reference: spread(&reference_times, name)?,
            })
        })
        .collect()
}

/// A schedule's prefill and decode phases on both sides ([`speed::phases`]).
fn phases(
    mine: &[Vec<StepTime>],
    theirs: Option<&ReferenceTiming>,
) -> (Option<Phase>, Option<Phase>) {
    let (port_prefill, port_decode) = speed::phases(mine);
    let (reference_prefill, reference_decode) =
        theirs.map_or((None, None), |t| speed::phases(&t.steps));
    let phase = |port: Option<(usize, usize, Vec<f64>)>,
                 reference: Option<(usize, usize, Vec<f64>)>| {
        let (tokens, steps, seconds) = port?;
        Some(Phase {
            tokens,
            steps,
            port: Spread::of(&seconds)?,
            reference: reference
                .filter(|(t, s, _)| (*t, *s) == (tokens, steps))
                .and_then(|(_, _, r)| Spread::of(&r)),
        })
    };
    (
        phase(port_prefill, reference_prefill),
        phase(port_decode, reference_decode),
    )
}

/// The port's warm-up and timed runs, in one hand-off to its thread (each call bounded by the
/// timeout), inside a rayon pool of `threads` threads.
fn time_port(
    port: &PortThread,
    tensors: Vec<Tensor>,
    state: Option<&StateDict>,
    schedule: Option<PortSchedule>,
    runs: usize,
    threads: usize,
) -> Result<Result<PortTimed, String>, PortFailure> {
    let f = port.port();
    let case = port.case();
    let names = port.names();
    let var_builder = state.map(StateDict::var_builder);
    let pool = pool(threads);
    port.run_watched("", move |beat| {
        let job = || -> Result<PortTimed, String> {
            let mut timed = PortTimed {
                totals: Vec::new(),
                marks: Vec::new(),
                steps: Vec::new(),
                peak_bytes: None,
                memory: None,
            };
            let mut memory = Memory::default();
            for i in 0..WARMUP + runs {
                let inputs = PortInputs {
                    tensors: crate::run::steps::fresh(&tensors).map_err(|e| e.to_string())?,
                    var_builder: var_builder.clone(),
                    case: case.clone(),
                    names: names.clone(),
                    schedule: schedule.clone().map(|s| PortSchedule {
                        at: Arc::default(),
                        ..s
                    }),
                };
                if i == WARMUP {
                    memory.start();
                }
                beat.beat();
                let (result, clocked) = speed::clocked(|| f(&inputs));
                drop(result?);
                if i >= WARMUP {
                    timed.totals.push(clocked.seconds);
                    let names = crate::judge::trace::numbered(
                        clocked.marks.iter().map(|(n, _)| n.as_str()),
                    );
                    timed.marks.push(
                        names
                            .into_iter()
                            .zip(clocked.marks.iter().map(|(_, t)| *t))
                            .collect(),
                    );
                    timed.steps.push(clocked.steps);
                }
            }
            (timed.peak_bytes, timed.memory) = memory.stop();
            Ok(timed)
        };
        match &pool {
            Ok(pool) => pool.install(job),
            Err(why) => job().map(|mut t| {
                t.memory
                    .get_or_insert_with(|| format!("(threads not pinned: {why})"));
                t
            }),
        }
    })
}

/// A rayon pool of `threads` threads for the port's timed calls, one per count, kept for the
/// process.
fn pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, String> {
    static POOLS: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == threads) {
        return Ok(Arc::clone(pool));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("golden timing {i}"))
        .build()
        .map_err(|e| e.to_string())?;
    let pool = Arc::new(pool);
    pools.push((threads, Arc::clone(&pool)));
    Ok(pool)
}

/// The rise of this process's resident set over a stretch of work, where Linux tells it.
#[derive(Default)]
struct Memory {
    before: Option<u64>,
    why_not: Option<String>,
}

impl Memory {
    fn start(&mut self) {
        // Free memory goes back to the system first: what the calls allocate shows as new pages.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory of glibc's allocator; no pointer is given.
        unsafe {
            libc::malloc_trim(0);
        }
        if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
            self.why_not = Some(format!("the peak resident set cannot be reset here ({e})"));
            return;
        }
        self.before = status("VmRSS");
        if self.before.is_none() {
            self.why_not = Some("/proc/self/status has no VmRSS here".into());
        }
    }

    /// The rise, or why there is none.
    fn stop(self) -> (Option<u64>, Option<String>) {
        let Some(before) = self.before else {
            return (None, self.why_not);
        };
        match status("VmHWM") {
            Some(peak) => (Some(peak.saturating_sub(before)), None),
            None => (None, Some("/proc/self/status has no VmHWM here".into())),
        }
    }
}

/// A size from `/proc/self/status`, bytes.
fn status(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_a_stretch_of_work_touches_shows_as_its_rise() {
        let mut memory = Memory::default();
        memory.start();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        drop(big);
        let (peak, why) = memory.stop();
        // Linux lets a process reset its own peak.
        let peak = peak.unwrap_or_else(|| panic!("no peak: {why:?}"));
        assert!(peak >= 60 << 20, "{peak}");
    }
}
