//! How golden calls the port: on a thread of its own, bounded by the check's timeout, its panics
//! caught and printed once per check.
//!
//! **A port that never returns.** Every call of the port's code — its forward pass, a backward
//! pass through the graph it built, an optimizer step of the overfit check — runs on a helper
//! thread (one per check, started on its first call; a Jacobian's columns, thousands of calls, run
//! in one job per core, on that thread and on threads of their own), and the test thread waits for
//! each call's answer at most the check's `timeout = N` seconds (else `GOLDEN_TIMEOUT`, default
//! 60). A call that does not answer in time fails its case with *the port did not return within N
//! s on `<case>`*. Rust cannot stop a thread from outside, so golden abandons it: **the stuck
//! thread keeps running (and keeps
//! what it holds) until the test process ends**, and the check's next call, if any, gets a fresh
//! thread. This is why a port must own what it captures: [`PortFn`] asks for
//! `Clone + Send + Sync + 'static`, which a plain function or a `move` closure over owned values
//! (or `Arc`s) is.
//!
//! **A panicking port.** A panic in the port's code is caught on its thread and reported as the
//! port's, on the smallest case that triggers it. Shrinking calls a panicking port many times:
//! while golden catches, a panic hook prints the first panic of a check as the previous hook would
//! (with its backtrace under `RUST_BACKTRACE`) and keeps the later ones quiet. The hook is
//! installed while at least one check runs in the process and the previous one restored when the
//! last ends; on threads where golden is not catching it always defers to the previous hook.

use crate::describe::outputs::{CaseValues, Outputs, PortInputs};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe, PanicHookInfo};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A port the runtime can call: any `Fn(&PortInputs) -> Result<Outputs, String>` that owns what it
/// captures — a function, or a `move` closure over `Clone` values — so that golden can run it on a
/// thread of its own and abandon that thread when the port never returns.
pub trait PortFn: Fn(&PortInputs) -> Result<Outputs, String> + Send + Sync + 'static {
    /// A handle on the port that can move to the port's thread.
    fn shared(&self) -> SharedPort;
}

impl<F> PortFn for F
where
    F: Fn(&PortInputs) -> Result<Outputs, String> + Clone + Send + Sync + 'static,
{
    fn shared(&self) -> SharedPort {
        Arc::new(self.clone())
    }
}

/// The port, shared with the thread it runs on.
pub type SharedPort = Arc<dyn Fn(&PortInputs) -> Result<Outputs, String> + Send + Sync>;

/// The port as the checks take it (`golden::check(&layer, &port)`): see [`PortFn`]. The lifetime
/// is only there for older signatures (`&Port<'_>`); a port is always `'static`.
pub type Port<'a> = dyn PortFn + 'a;

/// Why a call of the port's code produced nothing.
#[derive(Clone, Debug)]
pub(crate) struct PortFailure {
    /// The port's error, or its panic's message (with where it happened, beyond the forward
    /// call), or the empty string when it did not return.
    pub(crate) message: String,
    /// Whether `message` is a panic's.
    pub(crate) panicked: bool,
    /// Set when it did not return within this time (the case is then not shrunk).
    pub(crate) stuck: Option<Duration>,
}

impl PortFailure {
    /// Put this failure into a case's failure, saying on which case a stuck port got stuck.
    pub(crate) fn report(
        &self,
        failure: &mut crate::report::failure::CaseFailure,
        case: &crate::describe::inputs::CaseParams,
    ) {
        use crate::report::failure::PortFault;
        failure.port = Some(match self.stuck {
            Some(timeout) => PortFault::TimedOut(format!(
                "did not return within {} s on {case}; it keeps running on its own thread until \
                 the test process ends (golden cannot stop a thread, it abandons it); if the port \
                 is only slow, give it more time: `timeout = <seconds>` in the check's attribute, \
                 or GOLDEN_TIMEOUT",
                crate::describe::numbers::num(timeout.as_secs_f64())
            )),
            None if self.panicked => PortFault::Panicked(self.message.clone()),
            None => PortFault::Errored(self.message.clone()),
        });
    }
}

/// How long one call of the port may take: the check's `timeout = N`, else `GOLDEN_TIMEOUT`
/// (default 60 s; an invalid value fails the check in `settings` before any case runs).
pub(crate) fn port_timeout(layer: &crate::describe::layer::Layer) -> Duration {
    layer
        .timeout
        .or_else(|| crate::describe::env::timeout().ok())
        .unwrap_or(Duration::from_secs(60))
}

type Job = Box<dyn FnOnce() + Send>;

/// One of the parts of [`PortThread::run_parts`]: `f(part, heartbeat)`.
pub(crate) type PartJob<W, E> = Arc<dyn Fn(usize, &Heartbeat) -> Result<W, E> + Send + Sync>;

/// The port of one check and the thread it runs on.
pub(crate) struct PortThread {
    port: SharedPort,
    timeout: Duration,
    /// The thread's queue; `None` before the first call and after a call got stuck.
    jobs: RefCell<Option<mpsc::Sender<Job>>>,
    /// The last failure of a call, until [`PortThread::take_fault`].
    fault: RefCell<Option<PortFailure>>,
    /// The dims and configuration of the case being run ([`PortThread::enter_case`]): the port's
    /// parameters whose values depend on them get them (`PortInputs::dim`, `PortInputs::value`).
    case: RefCell<CaseValues>,
    /// The check's const, init and config values as written, resolved per case.
    values: Vec<(String, crate::describe::layer::Value)>,
    /// The check's tensor arguments' names, in order (a stepping port reads its inputs by name).
    names: Vec<String>,
}

impl PortThread {
    /// The port of a check, each call bounded by `timeout`.
    pub(crate) fn new(port: &Port<'_>, timeout: Duration) -> Self {
        PortThread {
            port: port.shared(),
            timeout,
            jobs: RefCell::new(None),
            fault: RefCell::new(None),
            case: RefCell::new(CaseValues::default()),
            values: Vec::new(),
            names: Vec::new(),
        }
    }

    /// The port of `layer`'s check: its arguments' names known, each call bounded by the check's
    /// timeout.
    pub(crate) fn of(port: &Port<'_>, layer: &crate::describe::layer::Layer) -> Self {
        let mut thread = Self::new(port, port_timeout(layer));
        thread.names = layer.args.iter().map(|a| a.name.clone()).collect();
        thread.values = layer
            .values()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        thread
    }

    /// The check's tensor arguments' names.
    pub(crate) fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// The case whose dims and configuration the next calls run with.
    pub(crate) fn enter_case(&self, case: &crate::describe::inputs::CaseParams) {
        let values = self
            .values
            .iter()
            .map(|(k, v)| (k.clone(), v.in_case(k, &case.dims, &case.config)))
            .collect();
        *self.case.borrow_mut() = CaseValues {
            dims: case.dims.clone(),
            picks: case.config.clone(),
            values,
        };
    }

    /// The dims and configuration of the case being run.
    pub(crate) fn case(&self) -> CaseValues {
        self.case.borrow().clone()
    }

    /// The port itself, to call inside [`PortThread::run`].
    pub(crate) fn port(&self) -> SharedPort {
        self.port.clone()
    }

    /// The last failure of a call since the last time it was taken: what a runner that carries
    /// errors as text reports as the port's (its panic, or that it got stuck).
    pub(crate) fn take_fault(&self) -> Option<PortFailure> {
        self.fault.borrow_mut().take()
    }

    /// Record and return a failure.
    pub(crate) fn fail(&self, failure: PortFailure) -> PortFailure {
        *self.fault.borrow_mut() = Some(failure.clone());
        failure
    }

    fn queue(&self) -> Result<mpsc::Sender<Job>, PortFailure> {
        if let Some(jobs) = self.jobs.borrow().as_ref() {
            return Ok(jobs.clone());
        }
        let (jobs, queue) = mpsc::channel::<Job>();
        let name = format!(
            "golden port ({})",
            std::thread::current().name().unwrap_or("a test")
        );
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in queue {
                    job();
                }
            })
            .map_err(|e| {
                self.fail(PortFailure {
                    message: format!("golden could not start a thread for the port: {e}"),
                    panicked: false,
                    stuck: None,
                })
            })?;
        *self.jobs.borrow_mut() = Some(jobs.clone());
        Ok(jobs)
    }

    /// Run the port's code `f` on the port's thread, at most the timeout. `during` says what it is
    /// (`the backward pass`; empty for the port's own call), for a panic's message.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        during: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PortFailure> {
        self.run_watched(during, move |_| f())
    }

    /// Run a job making several calls of the port's code on the port's thread, as one hand-off:
    /// the job calls [`Heartbeat::beat`] as each call starts, and each call, not the job, is
    /// bounded by the timeout (the job fails as stuck when no call has started for that long).
    /// Panics are the port's, as in [`PortThread::run`].
    pub(crate) fn run_watched<T: Send + 'static>(
        &self,
        during: &str,
        f: impl FnOnce(&Heartbeat) -> T + Send + 'static,
    ) -> Result<T, PortFailure> {
        let heartbeat = Heartbeat::new(Arc::new(AtomicBool::new(false)));
        let answered = self.dispatch(heartbeat.clone(), f)?;
        self.wait(during, &answered, &heartbeat, true)
    }

    /// Run `parts` jobs of calls of the port's code at once, `f(part, heartbeat)`: part 0 on the
    /// port's thread, each other on a thread of its own (a port is `Send + Sync`; tests already
    /// call one port from several threads). Each call is bounded by the timeout as in
    /// [`PortThread::run_watched`]. The parts are waited for in order and the first that fails —
    /// its error, its panic, a call that did not return — is the answer, as if they had run one
    /// after the other; the later parts are then told to stop ([`Heartbeat::cancelled`]).
    pub(crate) fn run_parts<W: Send + 'static, E: Send + 'static>(
        &self,
        during: &str,
        parts: usize,
        f: PartJob<W, E>,
    ) -> Result<Result<Vec<W>, E>, PortFailure> {
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = |cancel: &AtomicBool| cancel.store(true, Ordering::Release);
        let printed = SCOPE.with(|s| s.borrow().clone());
        let mut started = Vec::new();
        for part in 0..parts.max(1) {
            let heartbeat = Heartbeat::new(cancel.clone());
            let (beat, f) = (heartbeat.clone(), f.clone());
            let answered = if part == 0 {
                self.dispatch(beat, move |beat| f(0, beat))
            } else {
                let (answer, answered) = mpsc::channel();
                let printed = printed.clone();
                let name = format!(
                    "golden port {part} ({})",
                    std::thread::current().name().unwrap_or("a test")
                );
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || {
                        let _ = answer.send(catching_with(printed, || f(part, &beat)));
                    })
                    .map(|_| answered)
                    .map_err(|e| {
                        self.fail(PortFailure {
                            message: format!("golden could not start a thread for the port: {e}"),
                            panicked: false,
                            stuck: None,
                        })
                    })
            };
            match answered {
                Ok(answered) => started.push((answered, heartbeat)),
                Err(failure) => {
                    stop(&cancel);
                    return Err(failure);
                }
            }
        }
        let mut values = Vec::new();
        for (part, (answered, heartbeat)) in started.iter().enumerate() {
            match self.wait(during, answered, heartbeat, part == 0) {
                Ok(Ok(value)) => values.push(value),
                Ok(Err(e)) => {
                    stop(&cancel);
                    return Ok(Err(e));
                }
                Err(failure) => {
                    stop(&cancel);
                    return Err(failure);
                }
            }
        }
        Ok(Ok(values))
    }

    /// Queue `f` on the port's thread, catching its panic.
    fn dispatch<T: Send + 'static>(
        &self,
        heartbeat: Heartbeat,
        f: impl FnOnce(&Heartbeat) -> T + Send + 'static,
    ) -> Result<mpsc::Receiver<Result<T, String>>, PortFailure> {
        let printed = SCOPE.with(|s| s.borrow().clone());
        let (answer, answered) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = answer.send(catching_with(printed, || f(&heartbeat)));
        });
        // The thread only ends when its queue is dropped, so a send fails only if it could not
        // even start a job; then one fresh thread.
        if let Err(mpsc::SendError(job)) = self.queue()?.send(job) {
            self.jobs.borrow_mut().take();
            let _ = self.queue()?.send(job);
        }
        Ok(answered)
    }

    /// Wait for a job's answer, at most the timeout after its latest call started. A job on the
    /// port's thread (`port_thread`) that does not answer abandons that thread.
    fn wait<T>(
        &self,
        during: &str,
        answered: &mpsc::Receiver<Result<T, String>>,
        heartbeat: &Heartbeat,
        port_thread: bool,
    ) -> Result<T, PortFailure> {
        let panicked = |message: String| PortFailure {
            message: if during.is_empty() {
                message
            } else {
                format!("{message} (in {during})")
            },
            panicked: true,
            stuck: None,
        };
        let abandon = || {
            if port_thread {
                self.jobs.borrow_mut().take();
            }
        };
        loop {
            let wait = self.timeout.saturating_sub(heartbeat.since_last());
            match answered.recv_timeout(wait) {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(message)) => return Err(self.fail(panicked(message))),
                // A later call started meanwhile: it has its own timeout.
                Err(RecvTimeoutError::Timeout) if heartbeat.since_last() < self.timeout => {}
                Err(RecvTimeoutError::Timeout) => {
                    // Abandon the thread: dropping its queue ends it if it ever finishes this job.
                    abandon();
                    return Err(self.fail(PortFailure {
                        message: String::new(),
                        panicked: false,
                        stuck: Some(self.timeout),
                    }));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    abandon();
                    return Err(self.fail(panicked(
                        "the port's thread ended without an answer".to_string(),
                    )));
                }
            }
        }
    }
}

/// When the latest call of a job made of several ([`PortThread::run_watched`]) started: the
/// timeout counts from there. Also whether the job's answer is no longer wanted.
#[derive(Clone)]
pub(crate) struct Heartbeat {
    start: Instant,
    /// Nanoseconds from `start` to the latest beat.
    last: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
}

impl Heartbeat {
    fn new(cancel: Arc<AtomicBool>) -> Self {
        Heartbeat {
            start: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
            cancel,
        }
    }

    /// A call of the port's code starts now.
    pub(crate) fn beat(&self) {
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Release);
    }

    /// Whether the answer is no longer wanted (an earlier part failed): the job may stop.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// The time since the latest beat (or since the job was queued).
    fn since_last(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.last.load(Ordering::Acquire)))
    }
}

thread_local! {
    /// On a thread where golden is catching the port's panics: the check's flag "a panic was
    /// printed" (the hook prints while it is false, and sets it).
    static CATCHING: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
    /// On a test thread while a check runs: that check's flag.
    static SCOPE: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// The panic message of a payload.
fn message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(a panic without a message)".into())
}

/// Run `f` catching its panic (its message), printing it only if nothing was printed under
/// `printed` yet.
fn catching_with<T>(printed: Option<Arc<AtomicBool>>, f: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(printed));
    let result = catch_unwind(AssertUnwindSafe(f)).map_err(message);
    CATCHING.with(|c| c.replace(outer));
    result
}

/// Run `f` on this thread catching its panic (its message), quiet after the check's first.
pub(crate) fn catching<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catching_with(SCOPE.with(|s| s.borrow().clone()), f)
}

/// While it lives, the current thread runs a check: golden's panic hook is installed and the
/// check's panics are printed once.
pub(crate) struct PanicScope {
    outer: Option<Arc<AtomicBool>>,
}

impl PanicScope {
    /// Enter a check on this thread.
    pub(crate) fn enter() -> Self {
        hook_acquire();
        let outer = SCOPE.with(|s| s.replace(Some(Arc::new(AtomicBool::new(false)))));
        PanicScope { outer }
    }
}

impl Drop for PanicScope {
    fn drop(&mut self) {
        SCOPE.with(|s| s.replace(self.outer.take()));
        hook_release();
    }
}

type Hook = Arc<dyn Fn(&PanicHookInfo<'_>) + Send + Sync>;

/// Checks running in the process, and the hook golden's replaced while there are any.
static HOOK: Mutex<(usize, Option<Hook>)> = Mutex::new((0, None));

fn hook_acquire() {
    let mut state = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    state.0 += 1;
    // The hook cannot be changed from a panicking thread; golden's own then simply is not there.
    if state.1.is_some() || std::thread::panicking() {
        return;
    }
    let previous: Hook = Arc::from(std::panic::take_hook());
    state.1 = Some(previous.clone());
    std::panic::set_hook(Box::new(move |info| {
        let quiet = CATCHING
            .try_with(|c| {
                c.try_borrow().ok().and_then(|c| {
                    c.as_ref()
                        .map(|printed| printed.swap(true, Ordering::SeqCst))
                })
            })
            .ok()
            .flatten();
        if quiet != Some(true) {
            previous(info);
        }
    }));
}

fn hook_release() {
    let mut state = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    state.0 = state.0.saturating_sub(1);
    if state.0 > 0 || std::thread::panicking() {
        return;
    }
    if let Some(previous) = state.1.take() {
        let _golden_s = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| previous(info)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_message() {
        assert_eq!(catching(|| 7), Ok(7));
        assert_eq!(
            catching(|| -> () { panic!("boom {}", 1) }),
            Err("boom 1".to_string())
        );
    }

    #[test]
    fn a_call_that_does_not_return_is_abandoned_and_the_next_gets_a_fresh_thread() {
        let port = |_: &PortInputs| -> Result<Outputs, String> { Ok(Outputs(Vec::new())) };
        let thread = PortThread::new(&port, Duration::from_secs(1));
        let stuck = thread
            .run("", || loop {
                std::thread::park();
            })
            .map(|_: ()| ())
            .unwrap_err();
        assert_eq!(stuck.stuck, Some(Duration::from_secs(1)));
        assert!(thread.take_fault().is_some() && thread.take_fault().is_none());
        assert_eq!(thread.run("", || 5).unwrap(), 5);
        let panicked = thread
            .run("the backward pass", || -> () { panic!("in bwd") })
            .unwrap_err();
        assert_eq!(panicked.message, "in bwd (in the backward pass)");
        assert!(panicked.panicked && panicked.stuck.is_none());
    }

    #[test]
    fn each_call_of_a_job_has_the_whole_timeout_and_parts_answer_in_order() {
        let port = |_: &PortInputs| -> Result<Outputs, String> { Ok(Outputs(Vec::new())) };
        let thread = PortThread::new(&port, Duration::from_millis(300));
        // Three calls of 200 ms: longer than the timeout together, each within it.
        let calls = thread.run_watched("", |beat| {
            for _ in 0..3 {
                beat.beat();
                std::thread::sleep(Duration::from_millis(200));
            }
            3
        });
        assert_eq!(calls.unwrap(), 3);
        let stuck = thread
            .run_watched("", |beat| {
                beat.beat();
                std::thread::sleep(Duration::from_millis(900));
            })
            .unwrap_err();
        assert_eq!(stuck.stuck, Some(Duration::from_millis(300)));
        // The first part that fails is the answer, whatever the later ones do.
        let parts = |fail: Option<usize>, panic: Option<usize>| {
            thread.run_parts(
                "",
                3,
                Arc::new(move |part: usize, beat: &Heartbeat| {
                    beat.beat();
                    if panic == Some(part) {
                        panic!("part {part}");
                    }
                    if fail == Some(part) {
                        return Err(part);
                    }
                    Ok(part * 10)
                }),
            )
        };
        assert_eq!(parts(None, None).unwrap(), Ok(vec![0, 10, 20]));
        assert_eq!(parts(Some(1), Some(2)).unwrap(), Err(1));
        assert_eq!(parts(Some(2), Some(1)).unwrap_err().message, "part 1");
    }
}
