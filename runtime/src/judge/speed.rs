//! How fast and how big the port is beside its reference: the clock golden runs on the port's
//! thread while it times a case, and the figures it makes of both sides' runs.
//!
//! Once a forward check's cases pass in a dtype, golden times the port and the reference on one of
//! them (`run/speed.rs`; the reference's side is `reference_py/golden_ref/timing.py`): the same
//! inputs, parameters and dtype, each side warmed up, then run several times. A side's time is
//! the **median** of its timed runs, and the runs' **spread** (quartiles, fastest and slowest) is
//! its noise. The port's time over the reference's is the **ratio**; its range, from the port's
//! lower quartile over the reference's upper one to the port's upper quartile over the
//! reference's lower one, is what the runs agree on ([`Ratio`]).
//!
//! What is measured on the port's side (`clocked`): the call of the port (its function, as the
//! attribute calls it), less the time golden's own `VarBuilder` spends serving it weights (a
//! lookup per weight, measured inside it: `serving`). A traced check's points are the times of
//! its taps (`mark`); a schedule's steps the time of each call of its stepper (`step`), its
//! construction left out. Per trace point, both sides count the time from the end of the point
//! before it to its own end, the points inside it (tapped right before it, named under it)
//! included: [`point_times`]. The clock costs a thread-local lookup per tap, step and weight
//! served when it is not running, and a push when it is.

use serde_json::{json, Value as Json};
use std::cell::RefCell;
use std::time::{Duration, Instant};

thread_local! {
    static CLOCK: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// The clock of a call being timed, on its thread.
struct Running {
    start: Instant,
    /// Time golden's VarBuilder spent serving the port weights so far.
    serving: Duration,
    marks: Vec<(String, f64)>,
    steps: Vec<StepTime>,
}

impl Running {
    /// Seconds since the call began, less the serving so far.
    fn now(&self) -> f64 {
        (self.start.elapsed().saturating_sub(self.serving)).as_secs_f64()
    }
}

/// One step of a schedule, timed.
#[derive(Clone, Debug, PartialEq)]
pub struct StepTime {
    /// Its index, from 0 (the prefill).
    pub index: usize,
    /// Its positions (tokens).
    pub len: usize,
    /// The step's call, seconds.
    pub seconds: f64,
}

/// What one clocked call measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Clocked {
    /// The call, less the serving, seconds.
    pub seconds: f64,
    /// The time golden's VarBuilder spent serving the port weights during the call, seconds.
    pub serving: f64,
    /// Each tap, in order: its name as tapped and when it was made (seconds since the call
    /// began, less the serving before it).
    pub marks: Vec<(String, f64)>,
    /// Each step of a schedule.
    pub steps: Vec<StepTime>,
}

/// Whether a call is being timed on this thread.
pub fn running() -> bool {
    CLOCK.with(|c| c.borrow().is_some())
}

/// A tap named `name` is made now (nothing when no call is timed on this thread).
pub(crate) fn mark(name: &str) {
    CLOCK.with(|c| {
        if let Some(r) = c.borrow_mut().as_mut() {
            let at = r.now();
            r.marks.push((name.to_string(), at));
        }
    });
}

/// Run `f`, golden's serving of a weight to the port: its time is not the port's.
pub(crate) fn serving<R>(f: impl FnOnce() -> R) -> R {
    if !running() {
        return f();
    }
    let started = Instant::now();
    let out = f();
    let spent = started.elapsed();
    CLOCK.with(|c| {
        if let Some(r) = c.borrow_mut().as_mut() {
            r.serving += spent;
        }
    });
    out
}

/// Run `f`, the call of a schedule's step `index` of `len` positions, timing it.
pub(crate) fn step<R>(index: usize, len: usize, f: impl FnOnce() -> R) -> R {
    let before = CLOCK.with(|c| c.borrow().as_ref().map(Running::now));
    let out = f();
    if let Some(before) = before {
        CLOCK.with(|c| {
            if let Some(r) = c.borrow_mut().as_mut() {
                let seconds = (r.now() - before).max(0.0);
                r.steps.push(StepTime {
                    index,
                    len,
                    seconds,
                });
            }
        });
    }
    out
}

/// Run `f` with the clock running on this thread; returns its result and what the clock
/// measured. The clock stops however `f` ends.
pub(crate) fn clocked<R>(f: impl FnOnce() -> R) -> (R, Clocked) {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            CLOCK.with(|c| *c.borrow_mut() = None);
        }
    }
    CLOCK.with(|c| {
        *c.borrow_mut() = Some(Running {
            start: Instant::now(),
            serving: Duration::ZERO,
            marks: Vec::new(),
            steps: Vec::new(),
        })
    });
    let stop = Stop;
    let out = f();
    let running = CLOCK.with(|c| c.borrow_mut().take());
    drop(stop);
    let clocked = running.map_or_else(Clocked::default, |r| Clocked {
        seconds: r.now(),
        serving: r.serving.as_secs_f64(),
        marks: r.marks,
        steps: r.steps,
    });
    (out, clocked)
}

/// Several runs' times of one thing, seconds: their median, quartiles, fastest and slowest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median run.
    pub median: f64,
    /// The lower quartile (the second fastest of five runs): a quarter of the runs were faster.
    pub q1: f64,
    /// The upper quartile (the second slowest of five).
    pub q3: f64,
    /// The fastest run.
    pub min: f64,
    /// The slowest run.
    pub max: f64,
    /// How many runs.
    pub runs: usize,
}

impl Spread {
    /// The spread of `samples` (finite ones); `None` when there are none. Quantiles interpolate
    /// between the sorted runs (NumPy's default).
    pub fn of(samples: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let quantile = |p: f64| {
            let h = (n - 1) as f64 * p;
            let (k, frac) = (h.floor() as usize, h - h.floor());
            match v.get(k + 1) {
                Some(next) => v[k] + frac * (next - v[k]),
                None => v[k],
            }
        };
        Some(Spread {
            median: quantile(0.5),
            q1: quantile(0.25),
            q3: quantile(0.75),
            min: v[0],
            max: v[n - 1],
            runs: n,
        })
    }

    /// As the results file holds it.
    pub fn to_json(&self) -> Json {
        json!({
            "median": self.median,
            "q1": self.q1,
            "q3": self.q3,
            "min": self.min,
            "max": self.max,
            "runs": self.runs,
        })
    }

    /// From the results file.
    pub fn from_json(v: &Json) -> Option<Spread> {
        let (min, max) = (v["min"].as_f64()?, v["max"].as_f64()?);
        Some(Spread {
            median: v["median"].as_f64()?,
            q1: v["q1"].as_f64().unwrap_or(min),
            q3: v["q3"].as_f64().unwrap_or(max),
            min,
            max,
            runs: v["runs"].as_u64()? as usize,
        })
    }

    /// `1.2 ms (1.1–1.4 ms over 5 runs)`.
    pub fn describe(&self) -> String {
        use crate::describe::numbers::duration;
        format!(
            "{} ({}–{} over {} runs)",
            duration(self.median),
            duration(self.min),
            duration(self.max),
            self.runs
        )
    }
}

/// The port's time over the reference's: the medians', and the range the runs agree on — the
/// port's lower quartile over the reference's upper quartile, to the port's upper quartile over
/// the reference's lower one: what the middle half of each side's runs allow, however far one
/// stray run (a context switch, another process) went.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    /// The port's median over the reference's.
    pub median: f64,
    /// The smallest ratio the runs allow.
    pub lo: f64,
    /// The largest ratio the runs allow.
    pub hi: f64,
}

impl Ratio {
    /// `port` over `reference`; `None` when the reference took no measurable time.
    pub fn of(port: &Spread, reference: &Spread) -> Option<Ratio> {
        (reference.q1 > 0.0 && reference.median > 0.0).then(|| Ratio {
            median: port.median / reference.median,
            lo: port.q1 / reference.q3,
            hi: port.q3 / reference.q1,
        })
    }

    /// As the results file holds it.
    pub fn to_json(&self) -> Json {
        json!({"median": self.median, "lo": self.lo, "hi": self.hi})
    }

    /// From the results file.
    pub fn from_json(v: &Json) -> Option<Ratio> {
        Some(Ratio {
            median: v["median"].as_f64()?,
            lo: v["lo"].as_f64()?,
            hi: v["hi"].as_f64()?,
        })
    }

    /// How this ratio moved from `before` (another run's, of the same thing), when the two runs'
    /// ranges do not overlap: this median over the other's (above 1: slower than before). `None`
    /// when the ranges overlap — a move within what the runs' own spread allows is noise.
    pub fn moved_from(&self, before: &Ratio) -> Option<f64> {
        let apart = self.lo > before.hi || self.hi < before.lo;
        (apart && before.median > 0.0).then(|| self.median / before.median)
    }

    /// `1.8× (1.6–2.1×)`.
    pub fn describe(&self) -> String {
        format!(
            "{}× ({}–{}×)",
            times(self.median),
            times(self.lo),
            times(self.hi)
        )
    }
}

/// A ratio as the reports write it: 2 significant digits, 3 below 10.
pub fn times(x: f64) -> String {
    crate::describe::numbers::num_sig(x, if x.abs() < 10.0 { 3 } else { 2 })
}

/// One side of a timed case.
#[derive(Clone, Debug, PartialEq)]
pub struct Side {
    /// Its calls.
    pub seconds: Spread,
    /// How much its process's resident set rose over the timed runs, bytes (`None` where it could
    /// not be read): see `run/speed.rs`.
    pub peak_bytes: Option<u64>,
    /// The threads it computed on (candle's rayon pool for the port, torch's intra-op threads for
    /// the reference), when known.
    pub threads: Option<usize>,
}

impl Side {
    fn to_json(&self) -> Json {
        json!({
            "seconds": self.seconds.to_json(),
            "peak_bytes": self.peak_bytes,
            "threads": self.threads,
        })
    }

    fn from_json(v: &Json) -> Option<Side> {
        Some(Side {
            seconds: Spread::from_json(&v["seconds"])?,
            peak_bytes: v["peak_bytes"].as_u64(),
            threads: v["threads"].as_u64().map(|t| t as usize),
        })
    }
}

/// A trace point of a whole model, timed on both sides.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Its name (`blocks.2.attn`; `#2` when a module runs again).
    pub name: String,
    /// How many other timed points it is inside (0: a layer of the model).
    pub depth: usize,
    /// The port's time for it.
    pub port: Spread,
    /// The reference's.
    pub reference: Spread,
}

impl Point {
    /// The port's time over the reference's.
    pub fn ratio(&self) -> Option<Ratio> {
        Ratio::of(&self.port, &self.reference)
    }
}

/// The prefill or the decode steps of a schedule, timed.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    /// The tokens it covers (per batch row).
    pub tokens: usize,
    /// Its steps.
    pub steps: usize,
    /// The port's time for the whole phase in a run.
    pub port: Spread,
    /// The reference's (`None` in replay).
    pub reference: Option<Spread>,
}

impl Phase {
    /// The port's time over the reference's.
    pub fn ratio(&self) -> Option<Ratio> {
        Ratio::of(&self.port, self.reference.as_ref()?)
    }

    /// Tokens per second at the median run: the port's and the reference's.
    pub fn tokens_per_second(&self) -> (f64, Option<f64>) {
        let rate = |s: &Spread| self.tokens as f64 / s.median;
        (rate(&self.port), self.reference.as_ref().map(rate))
    }

    fn to_json(&self) -> Json {
        let (port_rate, reference_rate) = self.tokens_per_second();
        json!({
            "tokens": self.tokens,
            "steps": self.steps,
            "port": self.port.to_json(),
            "reference": self.reference.map(|s| s.to_json()),
            "ratio": self.ratio().map(|r| r.to_json()),
            "port_tokens_per_second": finite(port_rate),
            "reference_tokens_per_second": reference_rate.and_then(finite),
        })
    }

    fn from_json(v: &Json) -> Option<Phase> {
        Some(Phase {
            tokens: v["tokens"].as_u64()? as usize,
            steps: v["steps"].as_u64()? as usize,
            port: Spread::from_json(&v["port"])?,
            reference: Spread::from_json(&v["reference"]),
        })
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// How fast and how big the port is beside its reference on one case of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Speed {
    /// The dtype (`f32`).
    pub dtype: String,
    /// The case timed (as `GOLDEN_CASE` takes it).
    pub case: String,
    /// Untimed runs before the timed ones, on each side.
    pub warmup: usize,
    /// The port's side.
    pub port: Side,
    /// The reference's (`None`: not timed — a replay has no reference to run).
    pub reference: Option<Side>,
    /// The threads candle would compute on by itself (the port is pinned to the reference's
    /// count while timed).
    pub port_default_threads: usize,
    /// A traced check: every point both sides have, in the reference's execution order.
    pub points: Vec<Point>,
    /// A schedule: its first step (the prefill).
    pub prefill: Option<Phase>,
    /// A schedule: its one-token steps after the first (decode), per token.
    pub decode: Option<Phase>,
    /// What was not measured, and why.
    pub notes: Vec<String>,
    /// `debug` when golden itself is built with debug assertions (the dev and test profiles),
    /// else `release`: the port's time is its build's (candle's speed depends on the opt-level
    /// its crates are built with).
    pub build: String,
    /// How long the timing took, both sides, warm-up included (its cost to the check), seconds.
    pub spent: f64,
}

impl Speed {
    /// The port's time over the reference's, for the whole call.
    pub fn ratio(&self) -> Option<Ratio> {
        Ratio::of(&self.port.seconds, &self.reference.as_ref()?.seconds)
    }

    /// The port's peak memory rise over the reference's, when both were measured and the
    /// reference's rose at all.
    pub fn memory_ratio(&self) -> Option<f64> {
        let port = self.port.peak_bytes?;
        let reference = self.reference.as_ref()?.peak_bytes?;
        (reference > 0).then(|| port as f64 / reference as f64)
    }

    /// Whether the runs agree that the port is more than `max` times slower than the reference
    /// (the smallest ratio they allow, [`Ratio::lo`], is above it); `None` when the reference was
    /// not timed.
    pub fn over(&self, max: f64) -> Option<bool> {
        Some(self.ratio()?.lo > max)
    }

    /// One line: `port 1.2 ms, reference 0.6 ms: 2× (1.8–2.3×) in f32, 1 thread each`.
    pub fn summary(&self) -> String {
        use crate::describe::numbers::duration;
        let threads = |t: Option<usize>| {
            t.map_or("?".to_string(), |t| {
                format!("{t} thread{}", if t == 1 { "" } else { "s" })
            })
        };
        match (&self.reference, self.ratio()) {
            (Some(reference), Some(ratio)) => format!(
                "the port {} ({}), the reference {} ({}): {} in {}",
                duration(self.port.seconds.median),
                threads(self.port.threads),
                duration(reference.seconds.median),
                threads(reference.threads),
                ratio.describe(),
                self.dtype
            ),
            _ => format!(
                "the port {} ({}) in {}; the reference was not timed",
                duration(self.port.seconds.median),
                threads(self.port.threads),
                self.dtype
            ),
        }
    }

    /// As the results file holds it.
    pub fn to_json(&self) -> Json {
        json!({
            "dtype": self.dtype,
            "case": self.case,
            "warmup": self.warmup,
            "port": self.port.to_json(),
            "reference": self.reference.as_ref().map(Side::to_json),
            "ratio": self.ratio().map(|r| r.to_json()),
            "memory_ratio": self.memory_ratio(),
            "port_default_threads": self.port_default_threads,
            "points": self.points.iter().map(|p| json!({
                "point": p.name,
                "depth": p.depth,
                "port": p.port.to_json(),
                "reference": p.reference.to_json(),
                "ratio": p.ratio().map(|r| r.to_json()),
            })).collect::<Vec<_>>(),
            "prefill": self.prefill.as_ref().map(Phase::to_json),
            "decode": self.decode.as_ref().map(Phase::to_json),
            "notes": self.notes,
            "build": self.build,
            "spent": self.spent,
        })
    }

    /// From the results file.
    pub fn from_json(v: &Json) -> Option<Speed> {
        Some(Speed {
            dtype: v["dtype"].as_str()?.to_string(),
            case: v["case"].as_str().unwrap_or_default().to_string(),
            warmup: v["warmup"].as_u64().unwrap_or(0) as usize,
            port: Side::from_json(&v["port"])?,
            reference: Side::from_json(&v["reference"]),
            port_default_threads: v["port_default_threads"].as_u64().unwrap_or(0) as usize,
            points: v["points"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    Some(Point {
                        name: p["point"].as_str()?.to_string(),
                        depth: p["depth"].as_u64().unwrap_or(0) as usize,
                        port: Spread::from_json(&p["port"])?,
                        reference: Spread::from_json(&p["reference"])?,
                    })
                })
                .collect(),
            prefill: Phase::from_json(&v["prefill"]),
            decode: Phase::from_json(&v["decode"]),
            notes: v["notes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect(),
            build: v["build"].as_str().unwrap_or_default().to_string(),
            spent: v["spent"].as_f64().unwrap_or(0.0),
        })
    }
}

/// A port slower than its check allows (`speed(max = N)`), its timed runs agreeing: a failure of
/// its own kind, told after the numbers matched.
#[derive(Clone, Debug, PartialEq)]
pub struct TooSlow {
    /// What was measured.
    pub speed: Speed,
    /// The most times the reference's time the port may take.
    pub max: f64,
    /// The cases that passed in the dtype (the numbers matched on every one).
    pub cases: usize,
}

impl TooSlow {
    /// The points where the port is furthest behind the reference (its time beyond the
    /// reference's times as many as the limit allows), the worst first, at most `n`; the model's
    /// own layers (the points at depth 0) when none is.
    pub fn worst_points(&self, n: usize) -> Vec<&Point> {
        let excess = |p: &Point| p.port.median - self.max * p.reference.median;
        let mut points: Vec<&Point> = self
            .speed
            .points
            .iter()
            .filter(|p| p.ratio().is_some_and(|r| r.median > self.max))
            .collect();
        points.sort_by(|a, b| excess(b).total_cmp(&excess(a)));
        points.truncate(n);
        points
    }

    /// The cause in one line, for summaries.
    pub fn likely_cause(&self) -> String {
        let ratio = self.speed.ratio().map_or("?".into(), |r| times(r.median));
        match self.worst_points(1).first() {
            Some(p) => format!(
                "the port takes {ratio}× the reference's time, {}× at `{}`",
                p.ratio().map_or("?".into(), |r| times(r.median)),
                p.name
            ),
            None => format!("the port takes {ratio}× the reference's time"),
        }
    }

    /// The message's lines after its headline and case.
    pub fn lines(&self) -> Vec<String> {
        use crate::describe::numbers::duration;
        let s = &self.speed;
        let mut out = vec![format!(
            "the numbers match: {} case{} passed in {}; this failure is the port's speed alone",
            self.cases,
            if self.cases == 1 { "" } else { "s" },
            s.dtype
        )];
        let threads = |t: Option<usize>| t.map_or("?".into(), |t| t.to_string());
        out.push(format!(
            "the port: {} on {} thread(s) (candle alone would use {})",
            s.port.seconds.describe(),
            threads(s.port.threads),
            s.port_default_threads
        ));
        if let Some(r) = &s.reference {
            out.push(format!(
                "the reference: {} on {} thread(s)",
                r.seconds.describe(),
                threads(r.threads)
            ));
        }
        if let Some(r) = s.ratio() {
            out.push(format!(
                "the runs agree: the port's lower quartile is {}× the reference's upper quartile \
                 (the middle half of each side's runs, so that one stray run cannot decide)",
                times(r.lo)
            ));
        }
        let worst = self.worst_points(5);
        if !worst.is_empty() {
            out.push(
                "where the port is furthest behind (by trace point, each from the end of \
                      the point before it):"
                    .into(),
            );
            for p in worst {
                out.push(format!(
                    "  {}: the port {}, the reference {}: {}×",
                    p.name,
                    duration(p.port.median),
                    duration(p.reference.median),
                    p.ratio().map_or("?".into(), |r| times(r.median))
                ));
            }
        }
        for (what, phase) in [("prefill", &s.prefill), ("decode", &s.decode)] {
            if let (Some(phase), Some(ratio)) = (phase, phase.as_ref().and_then(Phase::ratio)) {
                let (port, reference) = phase.tokens_per_second();
                out.push(format!(
                    "{what} ({} token{}): the port {} tokens/s, the reference {} tokens/s: {}× its \
                     time",
                    phase.tokens,
                    if phase.tokens == 1 { "" } else { "s" },
                    crate::describe::numbers::num_sig(port, 3),
                    reference.map_or("?".into(), |r| crate::describe::numbers::num_sig(r, 3)),
                    times(ratio.median)
                ));
            }
        }
        let suggested = s.ratio().map_or(self.max * 2.0, |r| (r.hi * 1.25).ceil());
        out.push(format!(
            "fix: profile the port where it is furthest behind the reference{}; or, if this is \
             as fast as it gets, raise the limit: `speed(max = {})`",
            if s.points.is_empty() {
                " (with `trace` and `golden::tap`s, golden times each layer)"
            } else {
                " (the points above)"
            },
            crate::describe::numbers::num(suggested)
        ));
        out
    }
}

/// A point's name without the `#k` of a module that runs again.
fn base(name: &str) -> &str {
    match name.rsplit_once('#') {
        Some((b, k)) if !k.is_empty() && k.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => name,
    }
}

/// Whether point `child` is inside point `parent`: named under it (`blocks.2.attn` is inside
/// `blocks.2`), or, for a module that returns a tuple and so is a point per tensor
/// (`blocks.2.attn.0`), named under that module (`blocks.2.attn.qkv`; but `blocks.1` is not
/// inside `blocks.2`).
pub fn inside(child: &str, parent: &str) -> bool {
    let (c, p) = (base(child), base(parent));
    if c.strip_prefix(p).is_some_and(|r| r.starts_with('.')) {
        return true;
    }
    let Some((module, index)) = p.rsplit_once('.') else {
        return false;
    };
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    c.strip_prefix(module)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.split('.').next())
        .is_some_and(|first| !first.is_empty() && !first.bytes().all(|b| b.is_ascii_digit()))
}

/// The time of each kept point of one run, from `marks` (each point's name and when it ended, in
/// the order they ended): from the end of the kept point before it — before the kept points
/// inside it that ended just before it ([`inside`]), which are part of it — to its own end. The
/// first point starts with the call. Both sides' times are computed so, over the points both
/// have.
pub fn point_times(marks: &[(String, f64)], keep: impl Fn(&str) -> bool) -> Vec<(String, f64)> {
    let kept: Vec<&(String, f64)> = marks.iter().filter(|(n, _)| keep(n)).collect();
    let mut out = Vec::with_capacity(kept.len());
    for (i, (name, at)) in kept.iter().enumerate() {
        let mut j = i;
        while j > 0 && inside(&kept[j - 1].0, name) {
            j -= 1;
        }
        let start = if j == 0 { 0.0 } else { kept[j - 1].1 };
        out.push((name.clone(), (at - start).max(0.0)));
    }
    out
}

/// The prefill (the first step) and the decode (the one-token steps after it) of each run's
/// steps: `(tokens, steps, seconds of each run)` of each, `None` where a run has no such step.
#[allow(clippy::type_complexity)]
pub fn phases(
    runs: &[Vec<StepTime>],
) -> (
    Option<(usize, usize, Vec<f64>)>,
    Option<(usize, usize, Vec<f64>)>,
) {
    let prefill = runs
        .first()
        .and_then(|r| r.iter().find(|s| s.index == 0))
        .map(|first| {
            let seconds = runs
                .iter()
                .filter_map(|r| r.iter().find(|s| s.index == 0).map(|s| s.seconds))
                .collect();
            (first.len, 1, seconds)
        });
    let decode_steps = |r: &Vec<StepTime>| -> Vec<f64> {
        r.iter()
            .filter(|s| s.index > 0 && s.len == 1)
            .map(|s| s.seconds)
            .collect()
    };
    let decode = runs
        .first()
        .map(decode_steps)
        .filter(|d| !d.is_empty())
        .map(|first| {
            let seconds = runs.iter().map(|r| decode_steps(r).iter().sum()).collect();
            (first.len(), first.len(), seconds)
        });
    (prefill, decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_is_the_median_and_the_extremes() {
        let s = Spread::of(&[3.0, 1.0, 2.0, f64::NAN, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.5, 1.0, 10.0, 4));
        assert_eq!((s.q1, s.q3), (1.75, 4.75));
        assert_eq!(Spread::of(&[]), None);
        // Five runs: the quartiles are the second fastest and the second slowest, and one stray
        // run on each side moves neither.
        let port = Spread::of(&[2.0, 2.1, 2.2, 2.3, 9.0]).unwrap();
        let reference = Spread::of(&[0.2, 1.0, 1.1, 1.2, 1.3]).unwrap();
        assert_eq!((port.q1, port.q3), (2.1, 2.3));
        let r = Ratio::of(&port, &reference).unwrap();
        assert_eq!(r.median, 2.0);
        assert!(
            (r.lo - 2.1 / 1.2).abs() < 1e-12 && (r.hi - 2.3).abs() < 1e-12,
            "{r:?}"
        );
    }

    #[test]
    fn a_ratio_moved_only_when_the_runs_agree() {
        let before = Ratio {
            median: 1.0,
            lo: 0.8,
            hi: 1.25,
        };
        let noisy = Ratio {
            median: 1.4,
            lo: 1.2,
            hi: 1.6,
        };
        assert_eq!(noisy.moved_from(&before), None);
        let slower = Ratio {
            median: 1.8,
            lo: 1.5,
            hi: 2.1,
        };
        assert_eq!(slower.moved_from(&before), Some(1.8));
        let faster = Ratio {
            median: 0.5,
            lo: 0.4,
            hi: 0.6,
        };
        assert_eq!(faster.moved_from(&before), Some(0.5));
    }

    #[test]
    fn a_point_holds_the_points_inside_it() {
        assert!(inside("blocks.2.attn.qkv", "blocks.2.attn"));
        assert!(inside("blocks.2.attn", "blocks.2"));
        assert!(!inside("blocks.1", "blocks.2"));
        assert!(!inside("blocks.1.mlp", "blocks.2"));
        assert!(!inside("blocks.2", "blocks.2"));
        // A module that returns a tuple: its points are `<module>.<i>`.
        assert!(inside("layers.0.self_attn.q_proj", "layers.0.self_attn.0"));
        assert!(!inside("layers.0.self_attn.1", "layers.0.self_attn.0"));
        // A module run again.
        assert!(inside("a.b#2", "a#2"));
        assert!(!inside("a#1", "a#2"));

        let marks: Vec<(String, f64)> = [
            ("tok", 1.0),
            ("blocks.0.ln1", 2.0),
            ("blocks.0.attn.qkv", 3.0),
            ("blocks.0.attn.proj", 5.0),
            ("blocks.0.attn", 5.5),
            ("blocks.0.mlp", 8.0),
            ("blocks.0", 8.5),
            ("blocks.1", 12.0),
            ("head", 13.0),
        ]
        .iter()
        .map(|(n, t)| (n.to_string(), *t))
        .collect();
        let times = point_times(&marks, |n| n != "blocks.0.attn.qkv");
        let get = |n: &str| times.iter().find(|(m, _)| m == n).unwrap().1;
        assert_eq!(get("tok"), 1.0);
        assert_eq!(get("blocks.0.attn.proj"), 3.0);
        // From the end of ln1 (the last point before the points inside it).
        assert_eq!(get("blocks.0.attn"), 3.5);
        assert_eq!(get("blocks.0.mlp"), 2.5);
        assert_eq!(get("blocks.0"), 7.5);
        assert_eq!(get("blocks.1"), 3.5);
        assert_eq!(get("head"), 1.0);
    }

    #[test]
    fn prefill_and_decode_are_the_first_step_and_the_one_token_steps() {
        let run = |scale: f64| {
            vec![
                StepTime {
                    index: 0,
                    len: 5,
                    seconds: 4.0 * scale,
                },
                StepTime {
                    index: 1,
                    len: 3,
                    seconds: 2.0 * scale,
                },
                StepTime {
                    index: 2,
                    len: 1,
                    seconds: scale,
                },
                StepTime {
                    index: 3,
                    len: 1,
                    seconds: scale,
                },
            ]
        };
        let (prefill, decode) = phases(&[run(1.0), run(2.0)]);
        assert_eq!(prefill, Some((5, 1, vec![4.0, 8.0])));
        assert_eq!(decode, Some((2, 2, vec![2.0, 4.0])));
        let (_, none) = phases(&[vec![StepTime {
            index: 0,
            len: 4,
            seconds: 1.0,
        }]]);
        assert_eq!(none, None);
    }

    #[test]
    fn the_clock_times_steps_taps_and_leaves_out_serving() {
        let ((), c) = clocked(|| {
            mark("a");
            serving(|| std::thread::sleep(Duration::from_millis(200)));
            step(0, 3, || mark("b"));
        });
        assert!(!running());
        assert_eq!(c.marks.len(), 2);
        assert!(c.serving >= 0.2, "{c:?}");
        // The serving is not the port's: the call's own time (a few pushes) is left without it.
        assert!(c.marks[1].1 < c.serving && c.seconds < c.serving, "{c:?}");
        assert_eq!(c.steps.len(), 1);
        assert_eq!((c.steps[0].index, c.steps[0].len), (0, 3));
        // Outside a clocked call nothing is recorded, and a panic stops the clock.
        mark("outside");
        let _ = std::panic::catch_unwind(|| clocked(|| panic!("port")));
        assert!(!running());
    }
}
