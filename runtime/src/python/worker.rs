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

use crate::describe::env::{self, Python};
use crate::python::key::{pythonpath, WorkerKey};
use crate::python::wire::{self, Frame, WireError};
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much of a worker's stderr is kept for error messages.
const STDERR_TAIL: usize = 64 * 1024;

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

/// The process behind a worker: a private child of the test process, or a copy of the warm
/// interpreter forked by the shared worker daemon (`shared_worker.rs`).
enum Process {
    Private {
        child: Child,
        stderr: Arc<Mutex<Tail>>,
    },
    Shared {
        pid: u32,
        stream: UnixStream,
        /// Where the daemon's copy writes its stderr, and where the daemon says how it ended.
        log: PathBuf,
        exit: PathBuf,
    },
}

impl Process {
    /// How the process ended, if it has.
    fn ended(&mut self) -> Option<String> {
        match self {
            Process::Private { child, .. } => child.try_wait().ok().flatten().map(describe_status),
            Process::Shared { exit, .. } => std::fs::read_to_string(exit).ok(),
        }
    }

    fn kill(&mut self) {
        match self {
            Process::Private { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Process::Shared { pid, stream, .. } => {
                crate::python::shared::kill(*pid);
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Wait up to `limit` for the process to end; how it ended.
    fn wait_ended(&mut self, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.ended() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr_tail(&self) -> String {
        match self {
            Process::Private { stderr, .. } => stderr.lock().unwrap().text(),
            Process::Shared { log, .. } => crate::python::shared::tail(log, STDERR_TAIL),
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Process::Private { child, .. } => child.id(),
            Process::Shared { pid, .. } => *pid,
        }
    }
}

/// One running Python worker.
pub struct Worker {
    key: WorkerKey,
    process: Process,
    to_worker: Option<mpsc::Sender<Vec<u8>>>,
    from_worker: mpsc::Receiver<Result<Frame, WireError>>,
    threads: Vec<JoinHandle<()>>,
    next_id: u64,
    healthy: bool,
    /// The worker's answer to `hello`: versions of Python and NumPy, its pid (and, from the shared
    /// worker, its log, the daemon's pid and the client's).
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

/// The thread that writes requests to the worker.
fn writer_thread(mut sink: impl Write + Send + 'static) -> (mpsc::Sender<Vec<u8>>, JoinHandle<()>) {
    let (to_worker, requests) = mpsc::channel::<Vec<u8>>();
    let thread = std::thread::Builder::new()
        .name("golden-worker-in".into())
        .spawn(move || {
            for bytes in requests {
                if sink.write_all(&bytes).and_then(|_| sink.flush()).is_err() {
                    break;
                }
            }
        })
        .expect("spawn a thread");
    (to_worker, thread)
}

/// The thread that reads the worker's answers.
type Answers = mpsc::Receiver<Result<Frame, WireError>>;

fn reader_thread(source: impl Read + Send + 'static) -> (Answers, JoinHandle<()>) {
    let (answers, from_worker) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("golden-worker-out".into())
        .spawn(move || {
            let mut reader = std::io::BufReader::with_capacity(1 << 16, source);
            loop {
                let frame = wire::read_frame(&mut reader);
                let end = frame.is_err();
                if answers.send(frame).is_err() || end {
                    break;
                }
            }
        })
        .expect("spawn a thread");
    (from_worker, thread)
}

impl Worker {
    /// A worker for `key`: from the shared worker daemon when sharing is on and it can be reached,
    /// else a private one.
    pub fn start(key: &WorkerKey) -> Result<Worker, WorkerError> {
        if crate::python::shared::enabled() {
            match crate::python::shared::connect(key) {
                Ok(stream) => return Worker::over_socket(key, stream),
                Err(why) => crate::python::shared::note_fallback(&why),
            }
        }
        Worker::spawn(key)
    }

    /// Start a private worker (a child of this process) and wait for its `hello`.
    pub fn spawn(key: &WorkerKey) -> Result<Worker, WorkerError> {
        let pythonpath = pythonpath(key).map_err(|error| WorkerError::Spawn {
            python: key.python.clone(),
            error,
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
        let stdin: ChildStdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (to_worker, writer) = writer_thread(stdin);
        let (from_worker, reader) = reader_thread(stdout);
        let tail = Arc::new(Mutex::new(Tail::default()));
        let tail_writer = Arc::clone(&tail);
        let drain = std::thread::Builder::new()
            .name("golden-worker-err".into())
            .spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    tail_writer.lock().unwrap().push(&buf[..n]);
                }
            })
            .expect("spawn a thread");
        let worker = Worker {
            key: key.clone(),
            process: Process::Private {
                child,
                stderr: tail,
            },
            to_worker: Some(to_worker),
            from_worker,
            threads: vec![writer, reader, drain],
            next_id: 1,
            healthy: true,
            info: Json::Null,
        };
        worker.hello()
    }

    /// A worker served by the shared worker daemon over `stream`.
    fn over_socket(key: &WorkerKey, stream: UnixStream) -> Result<Worker, WorkerError> {
        let io_error = |e: std::io::Error| WorkerError::Protocol(format!("the shared worker: {e}"));
        let (to_worker, writer) = writer_thread(stream.try_clone().map_err(io_error)?);
        let (from_worker, reader) = reader_thread(stream.try_clone().map_err(io_error)?);
        let worker = Worker {
            key: key.clone(),
            // Until `hello` names the served copy, errors have no pid or log to point at.
            process: Process::Shared {
                pid: 0,
                stream,
                log: PathBuf::new(),
                exit: PathBuf::new(),
            },
            to_worker: Some(to_worker),
            from_worker,
            threads: vec![writer, reader],
            next_id: 1,
            healthy: true,
            info: Json::Null,
        };
        let mut worker = worker.hello()?;
        if let Process::Shared { pid, log, exit, .. } = &mut worker.process {
            *pid = worker.info["pid"].as_u64().unwrap_or(0) as u32;
            *log = PathBuf::from(worker.info["log"].as_str().unwrap_or_default());
            *exit = log.with_extension("exit");
        }
        Ok(worker)
    }

    fn hello(mut self) -> Result<Worker, WorkerError> {
        let (info, _) = self.request(
            json!({"op": "hello"}),
            Vec::new(),
            env::start_limit(),
            "starting up",
        )?;
        self.info = info;
        Ok(self)
    }

    /// The process id of the interpreter.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether this worker is a copy served by the shared worker daemon.
    pub fn is_shared(&self) -> bool {
        matches!(self.process, Process::Shared { .. })
    }

    /// Whether the worker can take more requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    fn stderr_tail(&self) -> String {
        self.process.stderr_tail()
    }

    /// Mark the worker dead and describe how it ended.
    fn died(&mut self, during: &str) -> WorkerError {
        self.healthy = false;
        // The process may still be writing its last words: give it a moment to exit.
        let status = match self.process.wait_ended(Duration::from_secs(2)) {
            Some(s) => s,
            None => {
                self.process.kill();
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
                self.process.kill();
                return Err(WorkerError::Protocol(format!("{e} while {during}")));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.healthy = false;
                self.process.kill();
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
            self.process.kill();
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
        // Closing its input asks the worker to exit; one that is busy in a reference gets killed.
        self.to_worker = None;
        if let Process::Shared { stream, .. } = &self.process {
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
        if self
            .process
            .wait_ended(Duration::from_millis(500))
            .is_none()
        {
            self.process.kill();
            self.process.wait_ended(Duration::from_secs(2));
        }
        if let Process::Shared {
            stream, log, exit, ..
        } = &self.process
        {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = std::fs::remove_file(log);
            let _ = std::fs::remove_file(exit);
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
        // An invalid GOLDEN_WORKERS is reported when a check opens its reference (`Live::new`).
        max: env::max_workers().unwrap_or(1),
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
                return match Worker::start(key) {
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
