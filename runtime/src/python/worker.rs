//! The Python worker process and the pool that shares workers between test threads.
//!
//! One interpreter serves many cases: importing torch costs ~1.6 s, a round trip well under a
//! millisecond. Each worker has three threads so that no pipe can block the test: one writes
//! requests to its stdin, one reads frames from its stdout, one drains its stderr into a bounded
//! tail (quoted in error messages). A request waits for its answer with a timeout, watching the
//! process meanwhile: a worker that dies is reported as dead at once, even while processes it
//! started hold its pipes. A worker that times out, dies or breaks the protocol is killed and
//! replaced by a fresh one on the next request.
//!
//! Each private worker is the leader of its own process group, and whatever the reference starts
//! (helpers, forked copies) joins it: killing a worker kills its group, so that nothing it started
//! outlives it or holds its pipes; the worker kills its group itself when the test process goes
//! away. The I/O threads of a worker are never joined: they end when the last holder of the pipes
//! does, which is no business of the test's.
//!
//! Large tensors travel through shared memory when both sides can map it ([`crate::python::shm`]):
//! the worker's `hello` answers the offer of this process's arena with its own. Frames are written
//! from the tensors' own buffers (no frame is gathered into one), and read straight into theirs.
//!
//! Pool policy: at most `GOLDEN_WORKERS` (default: the number of cores, at most 4) workers per test
//! process, started lazily when a check needs one and none is idle, kept until the process exits.
//! An idle worker's large shared memory is released after [`shm::IDLE`] by a janitor thread that
//! runs only while there is some.
//! A worker exits by itself when the test process goes away: its stdin reaches EOF, and a watchdog
//! thread in the worker notices its parent is gone even while a reference is busy.

use crate::describe::env::{self, Python};
use crate::python::key::{worker_environment, WorkerKey};
use crate::python::shared;
use crate::python::shm;
use crate::python::wire::{self, Frame, RawFrame, WireError};
use bytes::Bytes;
use golden_files::HostTensor;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How much of a worker's stderr is kept for error messages.
const STDERR_TAIL: usize = 64 * 1024;
/// How often a request waiting for its answer looks whether the worker is still alive.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);
/// How much of what an interpreter printed before the protocol an error quotes.
const QUOTED_BYTES: usize = 240;

/// What kind of error the reference side reported: parsed once from the worker's answer
/// (`"kind"`), and named by the runtime for the errors it finds itself on the reference's side (a
/// store, a checkpoint). Each kind leads the failure message to its own fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// The reference's module does not import.
    Import,
    /// The module has no such attribute.
    Attribute,
    /// The reference is not callable.
    NotCallable,
    /// A module-form check names something that is not an `nn.Module` class.
    NotModule,
    /// The request names a reference in a form the worker does not accept.
    Invalid,
    /// The reference raised on a case.
    Raised,
    /// The reference returned something golden cannot compare.
    ReturnType,
    /// The backend (torch, numpy) is missing or unusable.
    Backend,
    /// A schedule (`decode`, `steps`) could not be driven through the reference.
    Schedule,
    /// The reference's answer exceeds what one answer may hold.
    TooLarge,
    /// The reference gave different answers to the same case.
    Nondeterministic,
    /// A request or answer broke the protocol.
    Protocol,
    /// The worker itself failed.
    Internal,
    /// The golden store cannot answer (found by the runtime, in a replay).
    Store,
    /// The checkpoint (`weights = "..."`) does not fit the module (found by the runtime), or the
    /// worker cannot load it (changed on disk since the runtime hashed it).
    Weights,
    /// The worker holds no state of the id a request names (a checkpoint's): the runtime sends it
    /// the state and asks again (`answers/live.rs`).
    UnknownState,
    /// A kind this runtime does not know (a newer worker): shown as sent.
    Other(String),
}

impl RemoteKind {
    /// Every kind with the name it travels under (all but [`RemoteKind::Other`]).
    pub const NAMED: &'static [(&'static str, RemoteKind)] = &[
        ("import", RemoteKind::Import),
        ("attribute", RemoteKind::Attribute),
        ("not_callable", RemoteKind::NotCallable),
        ("not_module", RemoteKind::NotModule),
        ("invalid", RemoteKind::Invalid),
        ("raised", RemoteKind::Raised),
        ("return_type", RemoteKind::ReturnType),
        ("backend", RemoteKind::Backend),
        ("schedule", RemoteKind::Schedule),
        ("too_large", RemoteKind::TooLarge),
        ("nondeterministic", RemoteKind::Nondeterministic),
        ("protocol", RemoteKind::Protocol),
        ("internal", RemoteKind::Internal),
        ("store", RemoteKind::Store),
        ("weights", RemoteKind::Weights),
        ("unknown_state", RemoteKind::UnknownState),
    ];

    /// The kind a name stands for ([`RemoteKind::Other`] for one this runtime does not know).
    pub fn parse(name: &str) -> RemoteKind {
        RemoteKind::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, k)| k.clone())
            .unwrap_or_else(|| RemoteKind::Other(name.to_string()))
    }

    /// The name the kind travels under.
    pub fn as_str(&self) -> &str {
        match self {
            RemoteKind::Other(name) => name,
            known => RemoteKind::NAMED
                .iter()
                .find(|(_, k)| k == known)
                .map_or("internal", |(n, _)| n),
        }
    }
}

impl std::fmt::Display for RemoteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The worker answered a request with an error.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteError {
    /// What kind of error (each has its own fix).
    pub kind: RemoteKind,
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
        /// Which of golden's evaluations of the reference it was in, as the worker said it went.
        stage: Option<Stage>,
        /// The end of its stderr.
        stderr: String,
    },
    /// No answer in time; the worker was killed.
    Timeout {
        /// The limit that passed.
        limit: Duration,
        /// What it was doing.
        during: String,
        /// Which of golden's evaluations of the reference it was in, as the worker said it went.
        stage: Option<Stage>,
        /// The end of its stderr.
        stderr: String,
        /// Whether the worker was starting or importing the reference (`GOLDEN_START_TIMEOUT`),
        /// rather than running a case (`timeout = N`, `GOLDEN_TIMEOUT`).
        starting: bool,
    },
    /// The interpreter wrote something else than golden's protocol to its stdout before the
    /// worker's first answer: a wrapper script, a banner, a `sitecustomize` that prints.
    NotGolden {
        /// The interpreter.
        python: Python,
        /// The first bytes it wrote.
        bytes: Vec<u8>,
        /// The end of its stderr.
        stderr: String,
    },
    /// The import roots cannot be handed to the interpreter (a root whose path PYTHONPATH cannot
    /// carry, and no link to it): the message says why and what to change.
    ImportRoots(String),
    /// The worker's bytes were not a valid answer.
    Protocol(String),
    /// A request golden was about to send is over the frame limit: nothing was sent, the worker
    /// is fine. Says which side and what is in it.
    Oversized {
        /// The operation (`evaluate`, `state`, ...).
        op: String,
        /// What golden was doing.
        during: String,
        /// The request's size, and the limit.
        bytes: usize,
        /// The frame limit.
        limit: usize,
        /// How many tensors it carried, and the largest one's bytes.
        tensors: usize,
        /// The largest tensor's bytes.
        largest: usize,
    },
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
                 fix: run `golden setup` in your crate (creates golden's venv with numpy and \
                 torch; in golden's own checkout `cargo xtask setup`), or set GOLDEN_PYTHON to an \
                 interpreter that has them",
                python.program.display(),
                python.source
            ),
            WorkerError::Exited {
                python,
                status,
                during,
                stage,
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
                if let Some(stage) = stage {
                    write!(f, "\n  it died in {}", stage.explained())?;
                }
                if stderr.contains("No module named 'numpy'")
                    || stderr.contains("No module named 'golden_ref'")
                {
                    write!(
                        f,
                        "\n  fix: this interpreter lacks golden's Python side; run `golden setup` \
                         in your crate (it sets up golden's venv), or install numpy into this one: \
                         {} -m pip install numpy; or set GOLDEN_PYTHON to an interpreter with numpy \
                         and torch",
                        python.program.display()
                    )?;
                }
                Ok(())
            }
            WorkerError::Timeout {
                limit,
                during,
                stage,
                stderr,
                starting: false,
            } => write!(
                f,
                "the reference did not answer within {} s while {during}{}; the worker was killed \
                 and will be replaced.\n  its stderr ended with:\n{}\n  \
                 fix: if the reference is just slow, give it more time: `timeout = <seconds>` in \
                 the check's attribute, or GOLDEN_TIMEOUT for every check",
                crate::describe::numbers::num(limit.as_secs_f64()),
                stage
                    .as_ref()
                    .map_or_else(String::new, |s| format!(", in {}", s.name())),
                indent_tail(stderr)
            ),
            WorkerError::Timeout {
                limit,
                during,
                stderr,
                starting: true,
                ..
            } => write!(
                f,
                "the Python worker did not finish {during} within {} s; it was killed.\n  its \
                 stderr ended with:\n{}\n  \
                 fix: if it is just slow (a first `import torch` after a reboot can take a minute), \
                 give it more time with GOLDEN_START_TIMEOUT=<seconds>",
                crate::describe::numbers::num(limit.as_secs_f64()),
                indent_tail(stderr)
            ),
            WorkerError::NotGolden {
                python,
                bytes,
                stderr,
            } => write!(
                f,
                "the Python interpreter `{}` (chosen from {}) wrote {} to its stdout before golden's \
                 worker answered, where golden's protocol must begin: something prints to stdout \
                 as the interpreter starts, most likely a wrapper script around it, or a \
                 sitecustomize, usercustomize or .pth file.\n  its stderr ended with:\n{}\n  \
                 fix: make it print to stderr (or not at all), or set GOLDEN_PYTHON to the \
                 interpreter itself",
                python.program.display(),
                python.source,
                quote(bytes),
                indent_tail(stderr)
            ),
            WorkerError::ImportRoots(m) => write!(f, "{m}"),
            WorkerError::Protocol(m) => write!(f, "the worker broke the protocol: {m}"),
            WorkerError::Oversized {
                op,
                during,
                bytes,
                limit,
                tensors,
                largest,
            } => write!(
                f,
                "golden's request to the Python worker ({op}, {during}) would be {bytes} bytes, \
                 over the frame limit of {limit} bytes; nothing was sent. It carries {tensors} \
                 tensors, the largest {largest} bytes: a case this large cannot cross to the \
                 reference; make the dims or the state smaller (a checkpoint is sent by path, never \
                 in a request)"
            ),
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

/// Which of golden's evaluations of the reference a worker is in, as it says while it goes (a
/// `progress` frame before each: see `golden_ref.worker`): what a death or a hang is reported in,
/// however the worker ended (a crash, an exit, a SIGKILL from the out-of-memory killer, in any
/// thread), where a Python stack may not say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// `case` (an evaluation in the case dtype), `float64`, `construct`, or a stage a newer worker
    /// names.
    pub stage: String,
    /// The evaluation, as the worker's errors name it (`the forward pass in f32`, `a nudged
    /// evaluation`).
    pub phase: String,
}

impl Stage {
    /// The evaluation in a few words.
    pub fn name(&self) -> String {
        match self.stage.as_str() {
            "float64" => "golden's float64 evaluation of the reference".into(),
            "construct" => "the construction of the reference module".into(),
            "case" if self.phase.starts_with("a nudged") => {
                "one of golden's nudged evaluations of the reference".into()
            }
            _ => self.phase.clone(),
        }
    }

    /// The evaluation and what it tells: golden's float64 and nudged evaluations are golden's own,
    /// on a reference that runs in the case dtype.
    pub fn explained(&self) -> String {
        let name = self.name();
        match self.stage.as_str() {
            "float64" => format!(
                "{name} (it runs the reference again in float64, its upcasts promoted, to \
                 estimate the rounding error): the reference runs in the case dtype; a kernel \
                 without a float64 version should raise, which golden takes as no estimate \
                 (assert_close's bound), rather than crash"
            ),
            "case" if self.phase.starts_with("a nudged") => format!(
                "{name} (in the case dtype, on inputs moved by one ulp, to estimate the rounding \
                 error)"
            ),
            _ => name,
        }
    }
}

/// Bytes as a message quotes them: text in quotes with escapes, at most [`QUOTED_BYTES`].
fn quote(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(QUOTED_BYTES)];
    let more = if bytes.len() > shown.len() { "..." } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(shown))
}

/// The last bytes a worker wrote to stderr, and whether its stderr has closed.
#[derive(Default)]
struct Tail {
    bytes: VecDeque<u8>,
    closed: bool,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend(bytes);
        let excess = self.bytes.len().saturating_sub(STDERR_TAIL);
        self.bytes.drain(..excess);
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.iter().copied().collect::<Vec<_>>()).into_owned()
    }
}

/// The process behind a worker: a private child of the test process, or a copy of the warm
/// interpreter forked by the shared worker daemon (`shared_worker.rs`).
enum Process {
    Private {
        child: Child,
        stderr: Arc<Mutex<Tail>>,
        /// Whether `child` has been waited for: until then its pid (and so its process group's id)
        /// cannot be taken by another process.
        reaped: bool,
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
    /// How the process ended, if it has. A private worker that ended is not reaped here, so that
    /// [`Process::kill`] can still reach its process group.
    fn ended(&mut self) -> Option<String> {
        match self {
            Process::Private {
                child,
                reaped: true,
                ..
            } => child.try_wait().ok().flatten().map(describe_status),
            Process::Private { child, .. } => peek_exit(child.id()),
            Process::Shared { exit, .. } => read_exit(exit),
        }
    }

    /// Kill the worker and every process in its group (what the reference started), whether the
    /// worker still runs or not; a private worker is reaped.
    fn kill(&mut self) {
        match self {
            Process::Private { reaped: true, .. } => {}
            Process::Private { child, reaped, .. } => {
                kill_group(child.id());
                let _ = child.kill();
                let _ = child.wait();
                *reaped = true;
            }
            Process::Shared {
                pid, stream, exit, ..
            } => {
                // Once the daemon has reaped the copy (and killed its group) the pid is free for
                // any process to take.
                if !exit.exists() {
                    shared::kill(*pid);
                }
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
            Process::Shared { log, .. } => shared::tail(log, STDERR_TAIL),
        }
    }

    /// Wait up to `limit` for everything the process wrote to stderr to be read.
    fn drain_stderr(&self, limit: Duration) {
        let Process::Private { stderr, .. } = self else {
            return;
        };
        let deadline = Instant::now() + limit;
        while !stderr.lock().unwrap().closed && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
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
    to_worker: Option<mpsc::Sender<Vec<Bytes>>>,
    from_worker: Answers,
    next_id: u64,
    healthy: bool,
    /// Where the request being answered is, as the worker last said ([`Stage`]).
    stage: Option<Stage>,
    /// Shared memory with the worker, when both sides can map it.
    shm: Option<shm::Link>,
    /// The worker's answer to `hello`: versions of Python and NumPy, its pid (and, from the shared
    /// worker, its log, the daemon's pid and the client's).
    pub info: Json,
}

/// How a copy of the shared worker ended, as its daemon wrote it: `None` until the file holds it
/// (a daemon that wrote the file in place could be read between creating and filling it).
fn read_exit(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .filter(|s| !s.trim().is_empty())
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

/// How the child `pid` ended, if it has, leaving it a zombie (`WNOWAIT`): its pid and process
/// group id stay reserved until it is reaped.
fn peek_exit(pid: u32) -> Option<String> {
    let pid = libc::id_t::try_from(pid).ok()?;
    // SAFETY: waitid writes into a zeroed siginfo_t this function owns; P_PID limits it to our own
    // child, and WNOWAIT leaves that child to be reaped by `Child::wait`.
    let info = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        if rc != 0 || info.si_pid() == 0 {
            return None;
        }
        info
    };
    // SAFETY: si_status is valid for the SIGCHLD siginfo waitid filled in.
    let status = unsafe { info.si_status() };
    Some(if info.si_code == libc::CLD_EXITED {
        format!("exit code {status}")
    } else {
        use std::os::unix::process::ExitStatusExt;
        describe_status(ExitStatus::from_raw(status & 0x7f))
    })
}

/// SIGKILL to the process group `pgid` (a worker's, whose leader has not been reaped).
fn kill_group(pgid: u32) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // Never 0 or 1: those would be our own group or every process.
        if pgid > 1 {
            // SAFETY: sending a signal has no memory effects; the group is the worker's own.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// The thread that writes requests to the worker (never joined: see the module's doc). A request
/// is the frame's parts ([`wire::encode_parts`]), written in order from where they are.
fn writer_thread(sink: impl Write + Send + 'static) -> mpsc::Sender<Vec<Bytes>> {
    let (to_worker, requests) = mpsc::channel::<Vec<Bytes>>();
    // Small parts (headers between tensors) are gathered; large ones go straight to the pipe.
    let mut sink = std::io::BufWriter::with_capacity(1 << 16, sink);
    std::thread::Builder::new()
        .name("golden-worker-in".into())
        .spawn(move || {
            for parts in requests {
                let written = parts.iter().try_for_each(|part| sink.write_all(part));
                if written.and_then(|_| sink.flush()).is_err() {
                    break;
                }
            }
        })
        .expect("spawn a thread");
    to_worker
}

/// The thread that reads the worker's answers (never joined). Tensors in shared memory are read by
/// the request that waits for the answer ([`Worker::request`]).
type Answers = mpsc::Receiver<Result<RawFrame, WireError>>;

fn reader_thread(source: impl Read + Send + 'static) -> Answers {
    let (answers, from_worker) = mpsc::channel();
    std::thread::Builder::new()
        .name("golden-worker-out".into())
        .spawn(move || {
            let mut reader = std::io::BufReader::with_capacity(1 << 16, source);
            loop {
                let frame = match wire::read_raw_frame(&mut reader) {
                    // Quote what else arrived with the first bytes (a banner is one write).
                    Err(WireError::NotAFrame(mut bytes)) => {
                        let more = reader.buffer();
                        bytes.extend_from_slice(&more[..more.len().min(QUOTED_BYTES)]);
                        Err(WireError::NotAFrame(bytes))
                    }
                    frame => frame,
                };
                let end = frame.is_err();
                if answers.send(frame).is_err() || end {
                    break;
                }
            }
        })
        .expect("spawn a thread");
    from_worker
}

impl Worker {
    /// A worker for `key`: from the shared worker daemon when sharing is on and it can be reached,
    /// else a private one.
    pub fn start(key: &WorkerKey) -> Result<Worker, WorkerError> {
        // A daemon that did not serve this process (stuck, not golden's, not the one it needs) is
        // not tried again by it: each try would wait, or fail the same way.
        static AVOIDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if shared::enabled() && !AVOIDED.load(std::sync::atomic::Ordering::SeqCst) {
            let served = shared::connect(key).and_then(|c| Worker::over_socket(key, c));
            match served {
                Ok(worker) => return Ok(worker),
                Err(why) => {
                    AVOIDED.store(true, std::sync::atomic::Ordering::SeqCst);
                    shared::note_fallback(&why);
                }
            }
        }
        Worker::spawn(key)
    }

    /// Start a private worker (a child of this process) and wait for its `hello`.
    pub fn spawn(key: &WorkerKey) -> Result<Worker, WorkerError> {
        let environment = worker_environment(key).map_err(WorkerError::ImportRoots)?;
        let mut child = Command::new(&key.python.program)
            .args(["-u", "-B", "-m", "golden_ref.worker"])
            .env_clear()
            .envs(environment)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, which what the reference starts joins (see the module doc).
            .process_group(0)
            .spawn()
            .map_err(|e| WorkerError::Spawn {
                python: key.python.clone(),
                error: e.to_string(),
            })?;
        let stdin: ChildStdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let to_worker = writer_thread(stdin);
        let from_worker = reader_thread(stdout);
        let tail = Arc::new(Mutex::new(Tail::default()));
        let tail_writer = Arc::clone(&tail);
        std::thread::Builder::new()
            .name("golden-worker-err".into())
            .spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    tail_writer.lock().unwrap().push(&buf[..n]);
                }
                tail_writer.lock().unwrap().closed = true;
            })
            .expect("spawn a thread");
        let worker = Worker {
            key: key.clone(),
            process: Process::Private {
                child,
                stderr: tail,
                reaped: false,
            },
            to_worker: Some(to_worker),
            from_worker,
            next_id: 1,
            healthy: true,
            stage: None,
            shm: None,
            info: Json::Null,
        };
        worker.hello(env::start_limit(), json!({}))
    }

    /// A worker served by the shared worker daemon over `connection`, given this process's
    /// environment; `Err` says why the process at the socket cannot serve it (a private worker
    /// then does).
    fn over_socket(key: &WorkerKey, connection: shared::Connection) -> Result<Worker, String> {
        let io_error = |e: std::io::Error| format!("the shared worker's connection: {e}");
        let stream = connection.stream.try_clone().map_err(io_error)?;
        let to_worker = writer_thread(stream.try_clone().map_err(io_error)?);
        let from_worker = reader_thread(stream.try_clone().map_err(io_error)?);
        let environment = worker_environment(key)?;
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
            next_id: 1,
            healthy: true,
            stage: None,
            shm: None,
            info: Json::Null,
        };
        // A daemon's copy answers at once: one that does not within seconds is stuck (`start`
        // falls back to a private worker), whatever GOLDEN_START_TIMEOUT allows a start-up.
        let limit = shared::HELLO_TIMEOUT.min(env::start_limit());
        // The environment the copy takes as its own before it imports anything: the one a
        // private worker would be started with (every name and value as bytes, in hex).
        let hex = |s: &std::ffi::OsStr| {
            s.as_encoded_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let environ: Vec<[String; 2]> = environment
            .iter()
            .map(|(name, value)| [hex(name), hex(value)])
            .collect();
        let mut worker = match worker.hello(limit, json!({"environ": environ})) {
            Ok(worker) => worker,
            Err(WorkerError::Timeout { .. }) => return Err(shared::stuck(&connection.stream)),
            Err(WorkerError::NotGolden { bytes, .. }) => {
                return Err(connection.not_golden(&format!(
                    "it answered golden's hello with {}",
                    quote(&bytes)
                )))
            }
            Err(WorkerError::Exited { .. }) => {
                return Err(connection
                    .not_golden("it closed the connection without answering golden's hello"))
            }
            Err(e) => return Err(connection.not_golden(&format!("its answer to hello: {e}"))),
        };
        connection.verify(&worker.info)?;
        if let Process::Shared { pid, log, exit, .. } = &mut worker.process {
            *pid = worker.info["pid"].as_u64().unwrap_or(0) as u32;
            *log = PathBuf::from(worker.info["log"].as_str().unwrap_or_default());
            *exit = log.with_extension("exit");
        }
        Ok(worker)
    }

    /// Ask the worker for `hello` (the request `header` adds to it), offering it this process's
    /// shared memory; keep the link if the worker answers with its own, which must be its own (its
    /// pid) and a sealed memfd.
    fn hello(mut self, limit: Duration, mut header: Json) -> Result<Worker, WorkerError> {
        if env::shared_memory() == Ok(env::SharedMemory::Auto) {
            self.shm = shm::Link::offer()
                .map_err(|e| shm::note_unavailable(&format!("memfd_create: {e}")))
                .ok();
        }
        header["op"] = json!("hello");
        let (info, _) = self.request(header, Vec::new(), limit, "starting up")?;
        self.info = info;
        if let Some(link) = &mut self.shm {
            let pid = self.info["pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok());
            let accepted = match pid {
                Some(pid) => link.accept(&self.info, pid),
                None => Err("the worker's hello has no pid".into()),
            };
            if let Err(why) = accepted {
                shm::note_unavailable(&why);
                self.shm = None;
            }
        }
        Ok(self)
    }

    /// The smallest tensor that travels to and from this worker through shared memory; `None`
    /// when every tensor travels inline (shared memory off, unavailable, or set so).
    pub fn shared_memory(&self) -> Option<usize> {
        self.shm.as_ref().and_then(shm::Link::min)
    }

    /// Make tensors of at least `min` bytes travel through shared memory (`None`: every tensor
    /// inline), for benchmarks and golden's own tests. Returns whether this worker has shared
    /// memory at all (otherwise nothing changes).
    pub fn set_shared_memory(&mut self, min: Option<usize>) -> bool {
        match &mut self.shm {
            Some(link) => {
                link.set_min(min);
                true
            }
            None => false,
        }
    }

    /// Bytes of shared memory this process holds mapped for the worker.
    pub fn shared_memory_footprint(&self) -> usize {
        self.shm.as_ref().map_or(0, shm::Link::footprint)
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

    /// Mark the worker dead, end what it started, and describe how it ended.
    fn died(&mut self, during: &str) -> WorkerError {
        self.healthy = false;
        // The process may still be writing its last words: give it a moment to exit.
        let status = match self.process.wait_ended(Duration::from_secs(2)) {
            Some(s) => s,
            None => "a closed pipe (it was killed)".into(),
        };
        // Its group too: what the reference started would hold the pipes (and run on).
        self.process.kill();
        // Let the stderr thread catch up with what the process wrote before exiting.
        self.process.drain_stderr(Duration::from_secs(1));
        WorkerError::Exited {
            python: self.key.python.clone(),
            status,
            during: during.to_string(),
            stage: self.stage.take(),
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
        // Starting and importing the reference are bounded by GOLDEN_START_TIMEOUT, and say so.
        let starting = matches!(header["op"].as_str(), Some("hello" | "load"));
        self.stage = None;
        let id = self.next_id;
        self.next_id += 1;
        let payload: usize = tensors.iter().map(|t| t.data.len()).sum();
        let oversized = |bytes: usize| WorkerError::Oversized {
            op: header["op"].as_str().unwrap_or("?").to_string(),
            during: during.to_string(),
            bytes,
            limit: wire::MAX_FRAME,
            tensors: tensors.len(),
            largest: tensors.iter().map(|t| t.data.len()).max().unwrap_or(0),
        };
        if payload > wire::MAX_FRAME {
            return Err(oversized(payload));
        }
        let mut header = header;
        let (offsets, shared) = match &mut self.shm {
            Some(link) => link.place(&tensors),
            None => (Vec::new(), None),
        };
        if let (Some(shared), Some(object)) = (shared, header.as_object_mut()) {
            object.insert(wire::SHM_KEY.into(), shared);
        }
        let frame = Frame {
            id,
            header,
            tensors,
        };
        let parts = wire::encode_parts(&frame, &offsets);
        let in_shm: usize = (frame.tensors.iter().zip(&offsets))
            .filter_map(|(t, o)| o.map(|_| t.data.len()))
            .sum();
        let len = parts.iter().map(Bytes::len).sum::<usize>() - 4 + in_shm;
        if len > wire::MAX_FRAME {
            let largest = frame
                .tensors
                .iter()
                .map(|t| t.data.len())
                .max()
                .unwrap_or(0);
            return Err(WorkerError::Oversized {
                op: frame.header["op"].as_str().unwrap_or("?").to_string(),
                during: during.to_string(),
                bytes: len + 4,
                limit: wire::MAX_FRAME,
                tensors: frame.tensors.len(),
                largest,
            });
        }
        let sent = self.to_worker.as_ref().map(|tx| tx.send(parts).is_ok());
        if sent != Some(true) {
            return Err(self.died(during));
        }
        let frame = match self.answer(timeout) {
            Ok(Ok(frame)) => frame,
            Ok(Err(WireError::Eof)) | Err(Waited::Disconnected | Waited::Ended) => {
                return Err(self.died(during))
            }
            Ok(Err(WireError::NotAFrame(bytes))) if self.info.is_null() => {
                self.healthy = false;
                self.process.kill();
                self.process.drain_stderr(Duration::from_millis(200));
                return Err(WorkerError::NotGolden {
                    python: self.key.python.clone(),
                    bytes,
                    stderr: self.stderr_tail(),
                });
            }
            Ok(Err(e)) => {
                self.healthy = false;
                self.process.kill();
                return Err(WorkerError::Protocol(format!("{e} while {during}")));
            }
            Err(Waited::TimedOut) => {
                self.healthy = false;
                self.process.kill();
                return Err(WorkerError::Timeout {
                    limit: timeout,
                    during: during.to_string(),
                    stage: self.stage.take(),
                    stderr: self.stderr_tail(),
                    starting,
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
        let frame = match self.resolve(frame) {
            Ok(frame) => frame,
            Err(e) => {
                self.healthy = false;
                self.process.kill();
                return Err(WorkerError::Protocol(format!("{e} while {during}")));
            }
        };
        match ok {
            Some(true) => Ok((frame.header, frame.tensors)),
            Some(false) => Err(WorkerError::Remote(remote_error(&frame.header))),
            None => {
                self.healthy = false;
                Err(WorkerError::Protocol("an answer without `ok`".into()))
            }
        }
    }

    /// An answer with every tensor's bytes: those in the worker's arena copied out now, before
    /// the next request lets the worker write it again.
    fn resolve(&mut self, mut frame: RawFrame) -> Result<Frame, WireError> {
        if let Some(why) = frame
            .header
            .as_object_mut()
            .and_then(|o| o.remove("$shm_fallback"))
        {
            shm::note_unavailable(&format!(
                "the worker's own: {}",
                why.as_str().unwrap_or_default()
            ));
        }
        match &mut self.shm {
            Some(link) if frame.has_shared() => {
                frame.resolve(|desc, offset, len| link.read(desc, offset, len))
            }
            _ => frame.inline(),
        }
    }

    /// Release the shared memory of a worker idle for [`shm::IDLE`], if it is large.
    fn release_idle_shm(&mut self) {
        if let Some(link) = &mut self.shm {
            link.release_if_idle();
        }
    }
}

/// Why no answer came.
enum Waited {
    /// The reader thread is gone.
    Disconnected,
    /// The worker process ended (its pipes may still be held by what it started).
    Ended,
    /// The time limit passed.
    TimedOut,
}

impl Worker {
    /// Wait up to `timeout` for the next answer, looking every [`WATCH_INTERVAL`] whether the
    /// worker is still alive: a worker that died is noticed at once, even when its pipes stay open
    /// (a process it started holds them). The worker's `progress` frames on the way are kept as
    /// its [`Stage`].
    fn answer(&mut self, timeout: Duration) -> Result<Result<RawFrame, WireError>, Waited> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(WATCH_INTERVAL),
                None => WATCH_INTERVAL,
            };
            match self.from_worker.recv_timeout(slice) {
                Ok(Ok(frame)) if self.progressed(&frame) => continue,
                Ok(frame) => return Ok(frame),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Waited::Disconnected),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if self.process.ended().is_some() {
                // An answer it wrote just before it ended is still an answer; what it said before
                // is where it ended.
                loop {
                    match self.from_worker.recv_timeout(Duration::from_millis(50)) {
                        Ok(Ok(frame)) if self.progressed(&frame) => {}
                        Ok(Ok(frame)) => return Ok(Ok(frame)),
                        _ => return Err(Waited::Ended),
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Waited::TimedOut);
            }
        }
    }
}

impl Worker {
    /// Whether `frame` is a `progress` frame (`{"progress": stage, "phase": ...}`, no `ok`), kept
    /// as the worker's [`Stage`].
    fn progressed(&mut self, frame: &RawFrame) -> bool {
        let Some(stage) = frame.header.get("progress").and_then(Json::as_str) else {
            return false;
        };
        if frame.header.get("ok").is_some() {
            return false;
        }
        self.stage = Some(Stage {
            stage: stage.to_string(),
            phase: frame.header["phase"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        });
        true
    }
}

fn remote_error(header: &Json) -> RemoteError {
    let error = &header["error"];
    let text = |k: &str| error.get(k).and_then(Json::as_str).map(str::to_string);
    RemoteError {
        kind: text("kind").map_or(RemoteKind::Internal, |k| RemoteKind::parse(&k)),
        message: text("message").unwrap_or_else(|| "the worker gave no message".into()),
        traceback: text("traceback"),
        phase: text("phase"),
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing its input asks the worker to exit; one that is busy in a reference gets killed,
        // and with it, in either case, whatever the reference started.
        self.to_worker = None;
        if let Process::Shared { stream, .. } = &self.process {
            let _ = stream.shutdown(std::net::Shutdown::Write);
        }
        self.process.wait_ended(Duration::from_millis(500));
        self.process.kill();
        // A served copy: the daemon writes how it ended once it has reaped it (a private worker
        // is reaped by now).
        self.process.wait_ended(Duration::from_secs(2));
        if let Process::Shared {
            stream, log, exit, ..
        } = &self.process
        {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = std::fs::remove_file(log);
            let _ = std::fs::remove_file(exit);
        }
        // The I/O threads are not joined: they end when the pipes close, which a process that
        // escaped the group may delay; the test must not wait for it.
    }
}

/// Release the large shared memory of workers idle for [`shm::IDLE`]; ends when no idle worker
/// holds any (a worker checked in with some starts it again).
fn janitor() {
    loop {
        std::thread::sleep(shm::IDLE / 2);
        let mut state = pool().state.lock().unwrap();
        state.idle.iter_mut().for_each(Worker::release_idle_shm);
        let large = |w: &Worker| w.shared_memory_footprint() > shm::KEEP;
        if !state.idle.iter().any(large) {
            state.janitor = false;
            return;
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
    /// Whether the janitor thread runs (it releases idle workers' large shared memory).
    janitor: bool,
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
            janitor: false,
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
            if worker.shared_memory_footprint() > shm::KEEP && !state.janitor {
                state.janitor = true;
                std::thread::Builder::new()
                    .name("golden-shm-janitor".into())
                    .spawn(janitor)
                    .expect("spawn a thread");
            }
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

#[cfg(test)]
mod tests {
    use super::RemoteKind;

    #[test]
    fn an_exit_file_not_yet_filled_is_not_an_ending() {
        let dir = std::env::temp_dir().join(format!("golden-exit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker-1.exit");
        assert_eq!(super::read_exit(&path), None);
        std::fs::write(&path, "").unwrap();
        assert_eq!(super::read_exit(&path), None);
        std::fs::write(&path, "exit code 3").unwrap();
        assert_eq!(super::read_exit(&path).as_deref(), Some("exit code 3"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The kinds the Python side sends: every `"kind": "..."` of an error answer and the first
    /// argument of every `ReferenceError_(...)` in the worker's package.
    fn kinds_python_sends() -> Vec<String> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference_py/golden_ref");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for marker in ["\"kind\": \"", "ReferenceError_("] {
                for (i, _) in text.match_indices(marker) {
                    let rest = text[i + marker.len()..]
                        .trim_start()
                        .trim_start_matches('"');
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push(name);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn every_kind_the_worker_sends_is_known_and_round_trips() {
        let sent = kinds_python_sends();
        assert!(
            sent.len() >= 10,
            "the Python side's kinds were not found: {sent:?}"
        );
        for name in &sent {
            let kind = RemoteKind::parse(name);
            assert!(
                !matches!(kind, RemoteKind::Other(_)),
                "the worker sends the error kind `{name}`, which RemoteKind does not know"
            );
            assert_eq!(kind.as_str(), name);
        }
        // Every kind but the one the runtime finds itself is one the worker sends (`weights`
        // both: a checkpoint that does not fit, one that changed on disk since it was hashed).
        for (name, kind) in RemoteKind::NAMED {
            let runtime_side = matches!(kind, RemoteKind::Store);
            assert_eq!(sent.contains(&name.to_string()), !runtime_side, "{name}");
        }
        assert_eq!(RemoteKind::parse("newer").as_str(), "newer");
    }
}
