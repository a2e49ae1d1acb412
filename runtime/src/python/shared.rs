//! The shared worker: one warm interpreter for many test processes.
//!
//! `cargo nextest run` runs every test in its own process, and each would start its own Python and
//! import torch (1.6–3 s). With sharing on, a worker is instead a connection to a per-user daemon
//! (`python -m golden_ref.daemon`) listening on a Unix socket in `<target>/golden/workers/`: it
//! imported torch once, and forks a copy of itself for each connection, which then serves it like a
//! private worker (a crash or a hang ends that copy only). One daemon per interpreter, import path
//! (the whole `PYTHONPATH` a worker gets), working directory, the variables an interpreter reads
//! as it starts and imports torch (`READ_AS_PYTHON_STARTS`) and version of golden's Python side
//! (hashed into the socket's name). The daemon imports no reference: each copy imports its own
//! after the fork, so an edited reference is what the next test process runs.
//!
//! **Whose environment.** A copy runs with the environment of the test process it serves, not the
//! daemon's: the `hello` carries the environment a private worker would get, and the copy makes it
//! its own before it imports anything (`key::worker_environment`). Only what was read as the daemon
//! started (a thread pool's size, torch's switches, the locale) cannot be given afterwards: those
//! variables choose the daemon instead.
//!
//! **Whose daemon.** A copy's `hello` says which daemon it is (the identity its socket is named
//! after) and the daemon is the process listening (SO_PEERCRED): a process at the socket that is
//! not golden's daemon (any program of the user), or a daemon started for something else (another
//! golden, other roots), is not used; the check falls back to a private worker and says why.
//!
//! The socket lets in only its own user: its folder is made 0700 (and must belong to the user),
//! the socket is 0600, the daemon refuses a peer whose uid (SO_PEERCRED) is not its own, and a
//! client refuses a daemon of another user.
//!
//! Started on first use by whichever test process needs it, under a lock file so that two
//! processes starting at the same moment get one daemon; it leaves the starter's session and exits
//! after `GOLDEN_SHARED_IDLE` seconds (default 60) without connections. A copy it serves ends when
//! its connection closes or its test process is gone. When the daemon cannot be reached or started
//! (no target directory, a socket path too long for Unix sockets, a failing start), or accepts the
//! connection but does not answer (stopped, which the process table shows at once; stuck, which
//! [`HELLO_TIMEOUT`] shows), the check falls back to a private worker and says so once, naming the
//! daemon; this process does not try it again.
//!
//! `GOLDEN_SHARED_WORKER`: `auto` (default: on under nextest, which sets `NEXTEST`), `always` or
//! `never`. `GOLDEN_SHARED_DIR` moves the sockets elsewhere.

use crate::describe::env;
use crate::python::key::{pythonpath, worker_environment, WorkerKey};
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Unix socket paths are limited to 108 bytes (with the terminating NUL).
const MAX_SOCKET_PATH: usize = 100;

/// The beginnings of the names of the variables that are read as an interpreter starts and imports
/// numpy and torch, before the daemon forks: a copy cannot be given other values of these, so
/// they choose the daemon. Found by logging every `getenv` (an `LD_PRELOAD` shim) and every read
/// of `os.environ` while `python -m golden_ref.daemon` imports numpy, torch 2.15 and golden's
/// modules: Python's own (`PYTHON*`, the locale, `HOME` for the user's site-packages, `PATH`), the
/// loader's, the C and C++ runtimes', the thread pools' (OpenMP, MKL, oneDNN, OpenBLAS), numpy's
/// and torch's (and CUDA's and ROCm's, read when torch loads them), the temporary folder
/// `tempfile` keeps, and `GOLDEN_MAX_FRAME` (read by `golden_ref.wire` as it is imported). Any
/// other variable a copy gets from its test process, as a private worker would.
const READ_AS_PYTHON_STARTS: &[&str] = &[
    "PYTHON",
    "__PYVENV_LAUNCHER__",
    "LANG",
    "LC_",
    "HOME",
    "PATH",
    "TZ",
    "TMP",
    "TEMP",
    "LD_",
    "DYLD_",
    "GLIBC",
    "MALLOC_",
    "GFORTRAN_",
    "LLVM_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL",
    "ONEDNN_",
    "DNNL_",
    "OPENBLAS_",
    "GOTO_",
    "BLIS_",
    "VECLIB_",
    "NPY_",
    "NUMPY_",
    "TORCH",
    "PYTORCH_",
    "KINETO_",
    "FX_",
    "COMPILE_STROBELIGHT",
    "CUDA",
    "CUBLAS",
    "CUDNN",
    "NVRTC",
    "NV_",
    "NVIDIA_",
    "LIBNVVM",
    "HIP",
    "ROCM",
    "HSA_",
    "MIOPEN",
    "I_MPI_",
    "OMPI_",
    "MPI_",
    "OPENSSL_",
    "GOLDEN_MAX_FRAME",
];

/// Whether the variable `name` is read as the daemon's interpreter starts (see
/// [`READ_AS_PYTHON_STARTS`]): its value is part of the daemon's identity.
fn read_as_python_starts(name: &[u8]) -> bool {
    READ_AS_PYTHON_STARTS
        .iter()
        .any(|prefix| name.starts_with(prefix.as_bytes()))
}

/// 0: as the environment says; 1: on; 2: off.
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Turn sharing on or off for this process whatever `GOLDEN_SHARED_WORKER` says (`None`: as it
/// says). For tests of golden itself that watch their own worker processes; workers already
/// started keep their kind.
pub fn set_enabled(on: Option<bool>) {
    OVERRIDE.store(
        match on {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        },
        Ordering::SeqCst,
    );
}

/// Whether checks in this process use the shared worker.
pub fn enabled() -> bool {
    match OVERRIDE.load(Ordering::SeqCst) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    // A value golden cannot read fails the check before any worker starts (`run/check.rs`); here
    // it counts as the default.
    match env::shared_worker().unwrap_or(env::SharedWorker::Auto) {
        env::SharedWorker::Always => true,
        env::SharedWorker::Never => false,
        env::SharedWorker::Auto => std::env::var_os("NEXTEST").is_some(),
    }
}

/// Seconds a daemon stays without connections (`GOLDEN_SHARED_IDLE`, checked with the other
/// variables before any worker starts).
fn idle_seconds() -> f64 {
    env::shared_idle().unwrap_or(60.0)
}

/// Where the sockets, lock files and the served copies' logs live.
pub fn directory() -> Option<PathBuf> {
    if let Some(dir) = env::shared_dir() {
        return Some(dir);
    }
    Some(env::target_dir()?.join("golden").join("workers"))
}

fn fnv(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x100_0000_01b3);
    }
}

/// Which daemon serves `key`: the interpreter, every import root (the whole `PYTHONPATH` a worker
/// gets, the inherited part too), the variables read as it starts ([`read_as_python_starts`]), the
/// working directory (the first entry of a `python -m`'s import path) and the Python side's files
/// (a daemon started before they were edited must not answer for them). References need not be
/// hashed: the daemon never imports one (its copies do, after the fork); nor need the other
/// variables: each copy is given its test process's.
fn identity(key: &WorkerKey) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325;
    fnv(&mut hash, key.python.program.as_os_str().as_encoded_bytes());
    fnv(&mut hash, b"\0");
    if let Ok(path) = pythonpath(key) {
        fnv(&mut hash, path.as_encoded_bytes());
    }
    let mut startup: Vec<_> = std::env::vars_os()
        .filter(|(name, _)| read_as_python_starts(name.as_encoded_bytes()))
        .filter(|(name, _)| name != "PYTHONPATH")
        .collect();
    startup.sort();
    for (name, value) in startup {
        fnv(&mut hash, b"\0");
        fnv(&mut hash, name.as_encoded_bytes());
        fnv(&mut hash, b"=");
        fnv(&mut hash, value.as_encoded_bytes());
    }
    fnv(&mut hash, b"\0");
    if let Ok(cwd) = std::env::current_dir() {
        fnv(&mut hash, cwd.as_os_str().as_encoded_bytes());
    }
    let package = env::bundled_reference_root().join("golden_ref");
    let mut files: Vec<(String, u64, u128)> = std::fs::read_dir(&package)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let meta = e.metadata().ok()?;
            let modified = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                modified.as_nanos(),
            ))
        })
        .collect();
    files.sort();
    for (name, len, modified) in files {
        fnv(&mut hash, format!("{name}:{len}:{modified};").as_bytes());
    }
    hash
}

/// Make `dir` a folder only its user can enter: created 0700, or an existing one of this user made
/// 0700 (an older golden, or a umask of 000, may have left it open). One of another user is refused.
fn private_folder(dir: &Path) -> Result<(), String> {
    let error = |e: std::io::Error| format!("{}: {e}", dir.display());
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(error)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(error(e)),
    }
    let meta = std::fs::metadata(dir).map_err(error)?;
    if !meta.is_dir() {
        return Err(format!("{} is not a folder", dir.display()));
    }
    let me = own_uid();
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me}): set GOLDEN_SHARED_DIR to a folder \
             of your own",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(error)?;
    }
    Ok(())
}

fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The credentials of the process at the other end of `stream` (SO_PEERCRED).
#[cfg(target_os = "linux")]
fn peer_cred(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given length, which this function owns.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// The uid of the process at the other end of `stream`.
#[cfg(target_os = "linux")]
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    peer_cred(stream).map(|c| c.uid)
}

/// The uid of the process at the other end of `stream`.
#[cfg(not(target_os = "linux"))]
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: getpeereid writes two ids this function owns.
    let rc = unsafe { libc::getpeereid(stream.as_raw_fd(), &mut uid, &mut gid) };
    (rc == 0).then_some(uid)
}

/// The pid of the process at the other end of `stream` (the daemon that listens), if the system
/// says.
#[cfg(target_os = "linux")]
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    peer_cred(stream).and_then(|c| u32::try_from(c.pid).ok().filter(|p| *p > 0))
}

#[cfg(not(target_os = "linux"))]
fn peer_pid(_stream: &UnixStream) -> Option<u32> {
    None
}

/// How long a daemon that accepted a connection may take to answer `hello` (its copy is forked
/// from a process that has imported torch already: milliseconds, a second on a loaded machine).
/// One that does not answer by then is stuck, and a private worker takes over.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the daemon behind `stream` cannot answer, seen from the process table before any wait: it
/// is stopped (SIGSTOP, a debugger) or gone. `None` when it may well answer.
fn unresponsive(stream: &UnixStream) -> Option<String> {
    let pid = peer_pid(stream)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state is the field after the command name, which is in parentheses.
    let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
    match state {
        "T" | "t" => Some(format!(
            "the shared worker daemon (pid {pid}) is stopped (a SIGSTOP or a debugger): it \
             accepts connections and answers none; `kill -CONT {pid}` resumes it, `kill {pid}` \
             ends it (the next test process starts another)"
        )),
        "Z" | "X" => Some(format!(
            "the shared worker daemon (pid {pid}) has exited without removing its socket"
        )),
        _ => None,
    }
}

/// Tell a daemon that accepted this process's connection but did not answer within
/// [`HELLO_TIMEOUT`] from a slow start: a line that names it, for [`note_fallback`].
pub fn stuck(stream: &UnixStream) -> String {
    // Stopped since it accepted (a SIGSTOP takes effect when the process is next scheduled: on a
    // loaded machine, after the look before the wait), it is said so.
    if let Some(why) = unresponsive(stream) {
        return why;
    }
    let pid = peer_pid(stream).map_or("?".to_string(), |p| p.to_string());
    format!(
        "the shared worker daemon (pid {pid}) accepted the connection but did not answer within \
         {} s: it is stuck; `kill {pid}` ends it (the next test process starts another)",
        HELLO_TIMEOUT.as_secs()
    )
}

/// Connect to `socket`, and make sure the daemon there runs as this user: a socket planted by
/// another user would answer for the reference.
fn connect_own(socket: &Path) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect(socket)?;
    match peer_uid(&stream) {
        Some(uid) if uid == own_uid() => Ok(stream),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by {}, not by this user",
                socket.display(),
                other.map_or("an unknown user".to_string(), |u| format!("uid {u}"))
            ),
        )),
    }
}

/// A connection to the process listening at the shared worker's socket: the daemon for a key, as
/// far as this process knows until its copy's `hello` says so ([`Connection::verify`]).
pub struct Connection {
    /// The connection.
    pub stream: UnixStream,
    /// The socket.
    pub socket: PathBuf,
    /// The identity of the daemon this process needs (what the socket is named after).
    pub identity: String,
}

impl Connection {
    /// The pid of the process listening at the socket, as the message shows it.
    fn listener(&self) -> String {
        peer_pid(&self.stream).map_or("?".to_string(), |p| p.to_string())
    }

    /// Why the process at the socket is not golden's daemon, when it did not answer `hello` as
    /// one: `what` it did instead (closed the connection, wrote something else).
    pub fn not_golden(&self, what: &str) -> String {
        format!(
            "the process (pid {}) listening at {} is not golden's shared worker: {what}",
            self.listener(),
            self.socket.display()
        )
    }

    /// Check that the copy that answered `hello` with `info` was forked by the process listening
    /// at the socket, and that this is the daemon this process needs (started for the same
    /// interpreter, import roots, variables and golden). `Err` says why not, naming it.
    pub fn verify(&self, info: &serde_json::Value) -> Result<(), String> {
        let theirs = info["identity"].as_str().unwrap_or("none");
        let daemon = info["daemon_pid"].as_u64();
        let listener = peer_pid(&self.stream);
        if let (Some(daemon), Some(listener)) = (daemon, listener) {
            if daemon != u64::from(listener) {
                return Err(self.not_golden(&format!(
                    "the copy that answered was forked by pid {daemon}, not by it"
                )));
            }
        }
        if theirs != self.identity {
            let pid = self.listener();
            return Err(format!(
                "the shared worker daemon (pid {pid}) listening at {} is not the shared worker \
                 this test process needs: it was started for another interpreter, other import \
                 roots, other values of the variables read as Python starts, or by another golden \
                 (it answers as {theirs}, this process needs {}); `kill {pid}` ends it, and the \
                 next test process starts the right one",
                self.socket.display(),
                self.identity
            ));
        }
        Ok(())
    }
}

/// Connect to the daemon for `key`, starting it if needed. `Err` says why a private worker must do.
pub fn connect(key: &WorkerKey) -> Result<Connection, String> {
    let dir = directory().ok_or("no target directory to put its socket in")?;
    private_folder(&dir)?;
    let id = identity(key);
    let socket = dir.join(format!("{id:016x}.sock"));
    let connection = |stream| Connection {
        stream,
        socket: socket.clone(),
        identity: format!("{id:016x}"),
    };
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(format!(
            "its socket path would be {} bytes, more than Unix sockets allow (set \
             GOLDEN_SHARED_DIR to a shorter folder)",
            socket.as_os_str().len()
        ));
    }
    let refused = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
    match connect_own(&socket) {
        Ok(stream) => return answering(stream).map(connection),
        Err(e) if refused(&e) => return Err(e.to_string()),
        Err(_) => {}
    }
    // Start it, one process at a time: the others wait on the lock, then connect.
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(format!("{id:016x}.lock")))
        .map_err(|e| format!("its lock file: {e}"))?;
    // SAFETY: flock on a file descriptor this function owns; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "its lock file: {}",
            std::io::Error::last_os_error()
        ));
    }
    match connect_own(&socket) {
        Ok(stream) => return answering(stream).map(connection),
        Err(e) if refused(&e) => return Err(e.to_string()),
        Err(_) => {}
    }
    // Nobody listens: whatever file is there is left from a daemon that died.
    let _ = std::fs::remove_file(&socket);
    start(key, &socket, &format!("{id:016x}"))?;
    connect_own(&socket)
        .map(connection)
        .map_err(|e| format!("connecting after its start: {e}"))
}

/// `stream`, unless the daemon behind it visibly cannot answer (see [`unresponsive`]).
fn answering(stream: UnixStream) -> Result<UnixStream, String> {
    match unresponsive(&stream) {
        Some(why) => Err(why),
        None => Ok(stream),
    }
}

/// Start a daemon of `identity` listening on `socket`, with the environment a private worker of
/// this process would get, and wait until it says `ready`.
fn start(key: &WorkerKey, socket: &Path, identity: &str) -> Result<(), String> {
    let mut child = Command::new(&key.python.program)
        .args(["-u", "-B", "-m", "golden_ref.daemon", "--socket"])
        .arg(socket)
        .arg("--idle")
        .arg(idle_seconds().to_string())
        .args(["--identity", identity])
        .env_clear()
        .envs(worker_environment(key)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting `{}`: {e}", key.python.program.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    // What an interpreter prints as it starts (a banner, a sitecustomize) comes before `ready`:
    // skipped here, and harmless to the copies, which speak over the socket.
    std::thread::spawn(move || {
        let mut printed = String::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("ready") {
                let _ = tx.send(Ok(()));
                return;
            }
            if printed.len() < 200 {
                printed.push_str(&line);
                printed.push('\n');
            }
        }
        let _ = tx.send(Err(printed));
    });
    let limit = env::start_limit();
    let ready = rx
        .recv_timeout(limit)
        .map_err(|_| format!("not ready within {} s", limit.as_secs_f64()));
    if let Err(why) = ready.and_then(|r| r.map_err(|printed| format!("printed {printed:?}"))) {
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        return Err(format!(
            "it did not start ({why}): {}",
            err.trim().lines().last().unwrap_or("no message")
        ));
    }
    // The process we started has handed over to the detached daemon and exits now.
    let _ = child.wait();
    Ok(())
}

/// Say once per process why a private worker is used although sharing is on.
pub fn note_fallback(why: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        eprintln!("golden: the shared worker is not available ({why}); using private workers");
    });
}

/// Kill a copy served by the daemon (after a timeout or a broken protocol), and its process group:
/// what its reference started.
pub fn kill(pid: u32) {
    // pid 0 would be this process group: a copy that never said hello has no pid yet.
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        if pid > 1 {
            // SAFETY: sending a signal has no memory effects; the pid is the copy's own, the leader
            // of its own group.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The last `limit` bytes of a served copy's log.
pub fn tail(log: &Path, limit: usize) -> String {
    let Ok(mut file) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(limit as u64)));
    let mut bytes = Vec::new();
    let _ = file.take(limit as u64).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Wait until no daemon listens on `socket` (for tests of the idle exit).
pub fn wait_closed(socket: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if UnixStream::connect(socket).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The socket of the daemon that serves `key` (it may not be running).
pub fn socket_path(key: &WorkerKey) -> Option<PathBuf> {
    Some(directory()?.join(format!("{:016x}.sock", identity(key))))
}
