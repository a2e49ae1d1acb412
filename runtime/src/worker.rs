//! The Python worker process and the pool that shares workers between test threads.
//!
//! One interpreter serves many cases: importing torch costs ~1.6 s, a round trip well under a
//! millisecond. Each worker has three threads so that no pipe can block the test: one writes
//! requests to its stdin, one reads frames from its stdout, one drains its stderr into a bounded
//! tail (quoted in error messages). A request waits for its answer with a timeout; a worker that
//! times out, dies or breaks the protocol is killed and replaced by a fresh one on the next request.
//!
//! Pool policy: at most `GOLDEN_WORKERS` (default: the number of cores, at most 4) workers per test
//! process, started lazily when a check needs one and none is idle, kept until the process exits.
//! A worker exits by itself when the test process goes away: its stdin reaches EOF, and a watchdog
//! thread in the worker notices its parent is gone even while a reference is busy.

use crate::env::{self, Python};
use crate::wire::{self, Frame, HostTensor, WireError};
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much of a worker's stderr is kept for error messages.
const STDERR_TAIL: usize = 64 * 1024;
/// Start-up (interpreter + numpy) and loading a reference (which may import torch) get at least
/// this long, whatever `GOLDEN_TIMEOUT` says: a cold first `import torch` can take many seconds.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// Which interpreter and import roots a worker runs with; workers are shared only between checks
/// with the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerKey {
    /// The interpreter.
    pub python: Python,
    /// `PYTHONPATH` entries, in order.
    pub roots: Vec<PathBuf>,
}

impl WorkerKey {
    /// The key for a check declared in the crate at `manifest_dir`, from the environment.
    pub fn from_env(manifest_dir: Option<&str>) -> Self {
        WorkerKey {
            python: env::python(),
            roots: env::import_roots(manifest_dir),
        }
    }
}

/// The worker answered a request with an error.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteError {
    /// `import`, `attribute`, `not_callable`, `not_module`, `raised`, `return_type`, `backend`,
    /// `protocol`, `internal`.
    pub kind: String,
    /// One-line description.
    pub message: String,
    /// The Python traceback, where there is one.
    pub traceback: Option<String>,
    /// What the reference was doing when it raised (`raised` only).
    pub phase: Option<String>,
}

/// Why a request to the worker failed.
#[derive(Clone, Debug)]
pub enum WorkerError {
    /// The interpreter could not be started at all.
    Spawn {
        /// The interpreter.
        python: Python,
        /// The OS error.
        error: String,
    },
    /// The worker process ended.
    Exited {
        /// The interpreter.
        python: Python,
        /// Exit code or signal.
        status: String,
        /// What it was doing.
        during: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// No answer in time; the worker was killed.
    Timeout {
        /// The limit that passed.
        limit: Duration,
        /// What it was doing.
        during: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// The worker's bytes were not a valid answer.
    Protocol(String),
    /// The worker answered with an error.
    Remote(RemoteError),
}

fn indent_tail(stderr: &str) -> String {
    let trimmed = stderr.trim_end();
    if trimmed.is_empty() {
        return "    (nothing on stderr)".into();
    }
    trimmed
        .lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::Spawn { python, error } => write!(
                f,
                "could not start the Python interpreter `{}` (chosen from {}): {error}.\n\
                 fix: run `cargo xtask setup` (creates golden's venv with numpy and torch), or set \
                 GOLDEN_PYTHON to an interpreter that has them",
                python.program.display(),
                python.source
            ),
            WorkerError::Exited {
                python,
                status,
                during,
                stderr,
            } => {
                write!(
                    f,
                    "the Python worker (`{}`, chosen from {}) died with {status} while {during}.\n  \
                     its stderr ended with:\n{}",
                    python.program.display(),
                    python.source,
                    indent_tail(stderr)
                )?;
                if stderr.contains("No module named 'numpy'")
                    || stderr.contains("No module named 'golden_ref'")
                {
                    write!(
                        f,
                        "\n  fix: this interpreter lacks golden's Python side; run `cargo xtask setup` \
                         or set GOLDEN_PYTHON to an interpreter with numpy (and torch)"
                    )?;
                }
                Ok(())
            }
            WorkerError::Timeout {
                limit,
                during,
                stderr,
            } => write!(
                f,
                "the reference did not answer within {:.0} s while {during}; the worker was killed \
                 and will be replaced.\n  its stderr ended with:\n{}\n  \
                 fix: if the reference is just slow, give it more time: `timeout = <seconds>` in \
                 the check's attribute, or GOLDEN_TIMEOUT for every check",
                limit.as_secs_f64(),
                indent_tail(stderr)
            ),
            WorkerError::Protocol(m) => write!(f, "the worker broke the protocol: {m}"),
            WorkerError::Remote(e) => {
                write!(f, "{}", e.message)?;
                if let Some(tb) = &e.traceback {
                    write!(f, "\n  Python traceback:\n{}", indent_tail(tb))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for WorkerError {}

/// The last bytes a worker wrote to stderr.
#[derive(Default)]
struct Tail(VecDeque<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend(bytes);
        let excess = self.0.len().saturating_sub(STDERR_TAIL);
        self.0.drain(..excess);
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.iter().copied().collect::<Vec<_>>()).into_owned()
    }
}

/// One running Python worker.
pub struct Worker {
    key: WorkerKey,
    child: Child,
    to_worker: Option<mpsc::Sender<Vec<u8>>>,
    from_worker: mpsc::Receiver<Result<Frame, WireError>>,
    stderr: Arc<Mutex<Tail>>,
    threads: Vec<JoinHandle<()>>,
    next_id: u64,
    healthy: bool,
    /// The worker's answer to `hello`: versions of Python and NumPy, its pid.
    pub info: Json,
}

fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            return format!("signal {sig}{name}");
        }
    }
    format!("{status}")
}

impl Worker {
    /// Start a worker and wait for its `hello`.
    pub fn spawn(key: &WorkerKey) -> Result<Worker, WorkerError> {
        let pythonpath = std::env::join_paths(
            key.roots.iter().cloned().chain(
                std::env::var_os("PYTHONPATH")
                    .iter()
                    .flat_map(std::env::split_paths),
            ),
        )
        .map_err(|e| WorkerError::Spawn {
            python: key.python.clone(),
            error: format!("an import root cannot be put in PYTHONPATH: {e}"),
        })?;
        let mut child = Command::new(&key.python.program)
            .args(["-u", "-B", "-m", "golden_ref.worker"])
            .env("PYTHONPATH", pythonpath)
            .env("GOLDEN_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| WorkerError::Spawn {
                python: key.python.clone(),
                error: e.to_string(),
            })?;
        let mut stdin: ChildStdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");

        let (to_worker, writer_rx) = mpsc::channel::<Vec<u8>>();
        let (reader_tx, from_worker) = mpsc::channel();
        let tail = Arc::new(Mutex::new(Tail::default()));
        let tail_writer = Arc::clone(&tail);
        let threads = vec![
            std::thread::Builder::new()
                .name("golden-worker-stdin".into())
                .spawn(move || {
                    for bytes in writer_rx {
                        if stdin.write_all(&bytes).and_then(|_| stdin.flush()).is_err() {
                            break;
                        }
                    }
                })
                .expect("spawn a thread"),
            std::thread::Builder::new()
                .name("golden-worker-stdout".into())
                .spawn(move || {
                    let mut reader = std::io::BufReader::with_capacity(1 << 16, stdout);
                    loop {
                        let frame = wire::read_frame(&mut reader);
                        let end = frame.is_err();
                        if reader_tx.send(frame).is_err() || end {
                            break;
                        }
                    }
                })
                .expect("spawn a thread"),
            std::thread::Builder::new()
                .name("golden-worker-stderr".into())
                .spawn(move || {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = stderr.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        tail_writer.lock().unwrap().push(&buf[..n]);
                    }
                })
                .expect("spawn a thread"),
        ];
        let mut worker = Worker {
            key: key.clone(),
            child,
            to_worker: Some(to_worker),
            from_worker,
            stderr: tail,
            threads,
            next_id: 1,
            healthy: true,
            info: Json::Null,
        };
        let (info, _) = worker.request(
            json!({"op": "hello"}),
            Vec::new(),
            STARTUP_TIMEOUT,
            "starting up",
        )?;
        worker.info = info;
        Ok(worker)
    }

    /// The process id of the interpreter.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the worker can take more requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    fn stderr_tail(&self) -> String {
        self.stderr.lock().unwrap().text()
    }

    /// Mark the worker dead and describe how it ended.
    fn died(&mut self, during: &str) -> WorkerError {
        self.healthy = false;
        // The process may still be writing its last words: give it a moment to exit.
        let deadline = Instant::now() + Duration::from_secs(2);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        let status = match status {
            Some(s) => describe_status(s),
            None => {
                let _ = self.child.kill();
                "a closed pipe (it was killed)".into()
            }
        };
        // Let the stderr thread catch up with what the process wrote before exiting.
        std::thread::sleep(Duration::from_millis(20));
        WorkerError::Exited {
            python: self.key.python.clone(),
            status,
            during: during.to_string(),
            stderr: self.stderr_tail(),
        }
    }

    /// Send one request and wait up to `timeout` for its answer. `during` describes the request in
    /// error messages ("running case 3 of `gelu`").
    pub fn request(
        &mut self,
        header: Json,
        tensors: Vec<HostTensor>,
        timeout: Duration,
        during: &str,
    ) -> Result<(Json, Vec<HostTensor>), WorkerError> {
        if !self.healthy {
            return Err(WorkerError::Protocol(
                "the worker is no longer usable".into(),
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        let bytes = wire::encode(&Frame {
            id,
            header,
            tensors,
        });
        if bytes.len() - 4 > wire::MAX_FRAME {
            return Err(WorkerError::Protocol(format!(
                "a request of {} bytes exceeds the frame limit of {} bytes",
                bytes.len(),
                wire::MAX_FRAME
            )));
        }
        let sent = self.to_worker.as_ref().map(|tx| tx.send(bytes).is_ok());
        if sent != Some(true) {
            return Err(self.died(during));
        }
        let frame = match self.from_worker.recv_timeout(timeout) {
            Ok(Ok(frame)) => frame,
            Ok(Err(WireError::Eof)) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(self.died(during))
            }
            Ok(Err(e)) => {
                self.healthy = false;
                let _ = self.child.kill();
                return Err(WorkerError::Protocol(format!("{e} while {during}")));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.healthy = false;
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(WorkerError::Timeout {
                    limit: timeout,
                    during: during.to_string(),
                    stderr: self.stderr_tail(),
                });
            }
        };
        let ok = frame.header.get("ok").and_then(Json::as_bool);
        if frame.id != id {
            self.healthy = false;
            let _ = self.child.kill();
            let detail = if ok == Some(false) {
                format!(": {}", remote_error(&frame.header).message)
            } else {
                String::new()
            };
            return Err(WorkerError::Protocol(format!(
                "answer for request {} arrived while waiting for request {id}{detail}",
                frame.id
            )));
        }
        match ok {
            Some(true) => Ok((frame.header, frame.tensors)),
            Some(false) => Err(WorkerError::Remote(remote_error(&frame.header))),
            None => {
                self.healthy = false;
                Err(WorkerError::Protocol("an answer without `ok`".into()))
            }
        }
    }
}

fn remote_error(header: &Json) -> RemoteError {
    let error = &header["error"];
    let text = |k: &str| error.get(k).and_then(Json::as_str).map(str::to_string);
    RemoteError {
        kind: text("kind").unwrap_or_else(|| "internal".into()),
        message: text("message").unwrap_or_else(|| "the worker gave no message".into()),
        traceback: text("traceback"),
        phase: text("phase"),
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing stdin asks the worker to exit; one that is busy in a reference gets killed.
        self.to_worker = None;
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Workers shared by the checks of one test process.
pub struct Pool {
    state: Mutex<PoolState>,
    freed: Condvar,
    max: usize,
}

struct PoolState {
    idle: Vec<Worker>,
    live: usize,
}

/// A worker lent by the pool; it goes back when dropped (or is discarded if it died).
pub struct PooledWorker {
    worker: Option<Worker>,
}

impl std::ops::Deref for PooledWorker {
    type Target = Worker;
    fn deref(&self) -> &Worker {
        self.worker.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for PooledWorker {
    fn deref_mut(&mut self) -> &mut Worker {
        self.worker.as_mut().expect("present until drop")
    }
}

impl Drop for PooledWorker {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            pool().check_in(worker);
        }
    }
}

/// The process-wide pool.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(PoolState {
            idle: Vec::new(),
            live: 0,
        }),
        freed: Condvar::new(),
        max: env::max_workers(),
    })
}

impl Pool {
    /// Borrow a worker with this key: an idle one, a new one if under the limit, else wait.
    pub fn check_out(&self, key: &WorkerKey) -> Result<PooledWorker, WorkerError> {
        let mut state = self.state.lock().unwrap();
        loop {
            if let Some(pos) = state.idle.iter().position(|w| &w.key == key) {
                let worker = state.idle.swap_remove(pos);
                return Ok(PooledWorker {
                    worker: Some(worker),
                });
            }
            if state.live < self.max {
                state.live += 1;
                drop(state);
                return match Worker::spawn(key) {
                    Ok(worker) => Ok(PooledWorker {
                        worker: Some(worker),
                    }),
                    Err(e) => {
                        self.state.lock().unwrap().live -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            if !state.idle.is_empty() {
                // At the limit with only other keys idle: retire one of those.
                let retired = state.idle.remove(0);
                state.live -= 1;
                drop(state);
                drop(retired);
                state = self.state.lock().unwrap();
                continue;
            }
            state = self.freed.wait(state).unwrap();
        }
    }

    fn check_in(&self, worker: Worker) {
        let mut state = self.state.lock().unwrap();
        if worker.is_healthy() {
            state.idle.push(worker);
        } else {
            state.live -= 1;
            drop(state);
            drop(worker);
        }
        self.freed.notify_one();
    }

    /// Process ids of the idle workers (for the framework's own leak tests).
    pub fn idle_pids(&self) -> Vec<u32> {
        self.state
            .lock()
            .unwrap()
            .idle
            .iter()
            .map(Worker::pid)
            .collect()
    }
}
