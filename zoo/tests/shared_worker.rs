//! The shared worker (`runtime/src/shared_worker.rs`, `golden_ref/daemon.py`): test processes
//! started with `GOLDEN_SHARED_WORKER=always` share one daemon, whose copies behave like private
//! workers under faults, end with their test process, and which exits when idle. Each test runs
//! `golden-fault-child` processes with its own `GOLDEN_SHARED_DIR`, so each has its own daemon.

mod common;

use common::processes;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

struct Shared {
    dir: PathBuf,
}

impl Shared {
    fn new(name: &str) -> Shared {
        // Short: a Unix socket path has at most 108 bytes.
        let dir = PathBuf::from(format!("/tmp/gsw-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Shared { dir }
    }

    fn child(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_golden-fault-child"));
        c.args(args)
            .env("GOLDEN_SHARED_WORKER", "always")
            .env("GOLDEN_SHARED_DIR", &self.dir)
            .env("GOLDEN_SHARED_IDLE", "3");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.child(args).output().expect("the child runs")
    }

    /// The stdout of `golden-fault-child check <args>`, with `GOLDEN_FAULT_PIDS` pointing at
    /// `helpers`; if it has not ended after two minutes (it takes seconds), the processes the
    /// reference started are killed to free it, and the test fails.
    fn check_with_helpers(&self, args: &[&str], helpers: &Helpers) -> String {
        let mut child = self
            .child(&[&["check"], args].concat())
            .env("GOLDEN_FAULT_PIDS", &helpers.file)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the child runs");
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let started = helpers.pids();
                helpers.kill();
                let _ = child.kill();
                let _ = child.wait();
                panic!("the check was still waiting after 120 s for processes {started:?} that the reference started");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn info(&self) -> Json {
        let out = self.run(&["info"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    }

    fn socket(&self) -> PathBuf {
        std::fs::read_dir(&self.dir)
            .expect("the shared folder exists")
            .filter_map(|e| Some(e.ok()?.path()))
            .find(|p| p.extension().is_some_and(|x| x == "sock"))
            .expect("a socket")
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Leave no daemon behind, even when a test failed: each listens on a socket in `dir`, and
        // is ended by its pid.
        for pid in daemons_for(&self.dir) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The processes `fault_ref`'s references record in a file; whatever is left of them is killed
/// when the test ends.
struct Helpers {
    file: PathBuf,
}

impl Helpers {
    fn new(name: &str) -> Helpers {
        let file = PathBuf::from(format!("/tmp/gsw-{name}-{}.pids", std::process::id()));
        let _ = std::fs::remove_file(&file);
        Helpers { file }
    }

    fn pids(&self) -> Vec<u32> {
        processes::recorded_pids(&self.file)
    }

    fn kill(&self) {
        for pid in self.pids().into_iter().filter(|&p| processes::alive(p)) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.file);
    }
}

fn daemon_pid(info: &Json) -> u64 {
    info["daemon_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("not served by the daemon: {info}"))
}

/// The daemons listening on a socket in `dir` (their command line names it; their copies, which
/// have the same command line, are their children and not counted).
fn daemons_for(dir: &Path) -> Vec<u32> {
    let pattern = format!("--socket {}/", dir.display());
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            processes::alive(*pid) && cmd.contains(&pattern)
        })
        .collect();
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    all.iter()
        .copied()
        .filter(|pid| !parent(*pid).is_some_and(|p| all.contains(&p)))
        .collect()
}

#[test]
fn processes_starting_together_share_one_daemon() {
    let shared = Shared::new("together");
    let children: Vec<_> = (0..4)
        .map(|_| {
            shared
                .child(&["info"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let infos: Vec<Json> = children
        .into_iter()
        .map(|c| serde_json::from_slice(&c.wait_with_output().unwrap().stdout).unwrap())
        .collect();
    let daemon = daemon_pid(&infos[0]);
    for info in &infos {
        assert_eq!(daemon_pid(info), daemon, "{infos:?}");
        // Each process got its own copy, connected to it.
        assert_ne!(info["pid"].as_u64(), Some(daemon));
    }
    // The copies end with their processes (a copy notices its closed connection a moment after
    // its process is gone, hence the wait); the daemon alone is left.
    let copies: Vec<u32> = infos
        .iter()
        .map(|i| i["pid"].as_u64().unwrap() as u32)
        .collect();
    let left = processes::wait_gone(&copies, Duration::from_secs(10));
    assert!(left.is_empty(), "served copies still running: {left:?}");
    assert_eq!(daemons_for(&shared.dir).len(), 1);
    // A later process reuses it.
    assert_eq!(daemon_pid(&shared.info()), daemon);
}

#[test]
fn a_crash_in_a_served_copy_is_reported_and_the_daemon_survives() {
    let shared = Shared::new("crash");
    let before = daemon_pid(&shared.info());
    let out = shared.run(&["check", "fault_ref.exits"]);
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains("died with exit code 3 while running `fault_ref.exits`"),
        "{msg}"
    );
    let out = shared.run(&["check", "fault_ref.segfaults"]);
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains("died with signal 11 (SIGSEGV)") && msg.contains("in segfaults"),
        "{msg}"
    );
    assert_eq!(
        String::from_utf8_lossy(&shared.run(&["check", "fault_ref.identity"]).stdout).trim(),
        "pass"
    );
    assert_eq!(daemon_pid(&shared.info()), before);
}

#[test]
fn a_hanging_copy_is_killed_at_the_timeout() {
    let shared = Shared::new("hang");
    let out = shared.run(&["check", "fault_ref.sleeps", "2"]);
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains("did not answer within 2 s while running `fault_ref.sleeps`"),
        "{msg}"
    );
    assert_eq!(
        String::from_utf8_lossy(&shared.run(&["check", "fault_ref.identity"]).stdout).trim(),
        "pass"
    );
}

#[test]
fn copies_end_with_their_test_process() {
    let shared = Shared::new("orphan");
    for how in ["panic", "exit"] {
        let out = shared.run(&[how]);
        let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        assert!(!pids.is_empty(), "no copy was busy: {out:?}");
        let left = processes::wait_gone(&pids, Duration::from_secs(10));
        assert!(
            left.is_empty(),
            "copies {left:?} outlived their test process ({how})"
        );
    }
}

#[test]
fn the_daemon_exits_when_idle_and_removes_its_socket() {
    let shared = Shared::new("idle");
    let daemon = daemon_pid(&shared.info()) as u32;
    let socket = shared.socket();
    // GOLDEN_SHARED_IDLE is 3 s here.
    let left = processes::wait_gone(&[daemon], Duration::from_secs(30));
    assert!(left.is_empty(), "the daemon did not exit when idle");
    assert!(!socket.exists(), "{} is left", socket.display());
    // The next process starts a new one.
    assert_ne!(daemon_pid(&shared.info()) as u32, daemon);
}

#[test]
fn without_a_usable_folder_checks_fall_back_to_a_private_worker() {
    let out = Command::new(env!("CARGO_BIN_EXE_golden-fault-child"))
        .args(["check", "fault_ref.identity"])
        .env("GOLDEN_SHARED_WORKER", "always")
        .env("GOLDEN_SHARED_DIR", "/dev/null/cannot-be-a-folder")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pass");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("golden: the shared worker is not available (/dev/null/cannot-be-a-folder:")
            && err.contains("using private workers"),
        "{err}"
    );
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_socket_and_its_folder_are_private_even_under_umask_000() {
    let shared = Shared::new("umask");
    // The child (and so the daemon it starts) runs with umask 000, where every file golden creates
    // without an explicit mode would be open to every local user.
    let out = Command::new("sh")
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_golden-fault-child"))
        .args(["check", "fault_ref.exits"])
        .env("GOLDEN_SHARED_WORKER", "always")
        .env("GOLDEN_SHARED_DIR", &shared.dir)
        .env("GOLDEN_SHARED_IDLE", "3")
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(msg.contains("died with exit code 3"), "{msg}");
    assert_eq!(mode(&shared.dir), 0o700, "{}", shared.dir.display());
    for entry in std::fs::read_dir(&shared.dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(
            mode(&path) & 0o077,
            0,
            "{} is open to others",
            path.display()
        );
    }
    assert_eq!(mode(&shared.socket()), 0o600);
}

/// Connect to `socket` as user `nobody` and send a `hello` frame: `answered`, `closed` (the
/// daemon hung up) or `refused: <why>` (the connection was not allowed).
fn hello_as_nobody(socket: &Path) -> String {
    let client = format!("/tmp/gsw-intruder-{}.py", std::process::id());
    std::fs::write(
        &client,
        r#"import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("refused:", e.strerror)
    sys.exit(0)
header = json.dumps({"op": "hello"}).encode()
body = b"GLD1" + struct.pack("<QI", 1, len(header)) + header + struct.pack("<I", 0)
try:
    s.sendall(struct.pack("<I", len(body)) + body)
    print("answered" if s.recv(4) else "closed")
except OSError as e:
    print("closed:", e.strerror)
"#,
    )
    .unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
        ])
        .arg(&client)
        .arg(socket)
        .output()
        .expect("setpriv runs");
    let _ = std::fs::remove_file(&client);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

#[test]
fn another_user_cannot_use_the_daemon() {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        == b"0\n";
    if !root || !Path::new("/usr/bin/setpriv").exists() || !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs root, setpriv and /usr/bin/python3 to connect as another user (the daemon's check of its peer is unit-tested in reference_py/tests/test_daemon.py)");
        return;
    }
    let shared = Shared::new("intruder");
    let daemon = daemon_pid(&shared.info());
    let socket = shared.socket();
    // The folder and the socket keep other users out...
    let answer = hello_as_nobody(&socket);
    assert!(answer.starts_with("refused: Permission denied"), "{answer}");
    // ...and where they were opened up (an older golden, a shared folder), the daemon itself
    // refuses a peer that is not its own user.
    use std::os::unix::fs::PermissionsExt;
    for path in [&shared.dir, &socket] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let answer = hello_as_nobody(&socket);
    assert!(answer.starts_with("closed"), "{answer}");
    // Its own user is still served, by the same daemon.
    assert_eq!(daemon_pid(&shared.info()), daemon);
}

#[test]
fn a_copy_that_forks_and_exits_is_reported_as_dead_and_leaves_nothing() {
    let shared = Shared::new("fork");
    let helpers = Helpers::new("fork");
    let msg = shared.check_with_helpers(&["fault_ref.forks_then_exits", "60"], &helpers);
    assert!(
        msg.contains("died with exit code 3 while running `fault_ref.forks_then_exits`"),
        "{msg}"
    );
    let msg = shared.check_with_helpers(&["fault_ref.spawns_then_hangs", "2"], &helpers);
    assert!(msg.contains("did not answer within 2 s"), "{msg}");
    let pids = helpers.pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let left = processes::wait_gone(&pids, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "processes {left:?} started by references are still running"
    );
    assert_eq!(
        String::from_utf8_lossy(&shared.run(&["check", "fault_ref.identity"]).stdout).trim(),
        "pass"
    );
}

#[test]
fn helpers_of_a_served_copy_end_with_its_test_process() {
    let shared = Shared::new("helpers");
    let helpers = Helpers::new("helpers");
    for reference in [
        "fault_ref.spawns_and_returns",
        "fault_ref.forks_and_returns",
    ] {
        assert_eq!(
            shared.check_with_helpers(&[reference], &helpers).trim(),
            "pass"
        );
    }
    // One per call of the references: every case, in f32, float64 and nudged.
    let pids = helpers.pids();
    assert!(pids.len() >= 2, "{pids:?}");
    let left = processes::wait_gone(&pids, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "processes {left:?} started by references outlived their test process"
    );
}

#[test]
fn a_served_copy_reads_end_of_file_on_stdin() {
    let shared = Shared::new("stdin");
    let msg =
        String::from_utf8_lossy(&shared.run(&["check", "fault_ref.reads_stdin", "60"]).stdout)
            .into_owned();
    assert!(msg.contains("EOFError: EOF when reading a line"), "{msg}");
    assert_eq!(
        String::from_utf8_lossy(&shared.run(&["check", "fault_ref.closes_stdin"]).stdout).trim(),
        "pass"
    );
}

/// A folder holding the module `name` whose `f` returns `body`.
fn module(root: &Path, name: &str, body: &str) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(
        root.join(format!("{name}.py")),
        format!("def f(x):\n    return {body}\n"),
    )
    .unwrap();
}

#[test]
fn a_changed_pythonpath_is_what_the_next_test_process_imports() {
    let shared = Shared::new("pythonpath");
    // In the shared folder, which the test removes.
    let (one, two) = (shared.dir.join("one"), shared.dir.join("two"));
    module(&one, "stale_ref", "x.clone()");
    module(&two, "stale_ref", "x * 2");
    let check = |root: &Path| {
        let out = shared
            .child(&["check", "stale_ref.f"])
            .env("PYTHONPATH", root)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(check(&one).trim(), "pass");
    let msg = check(&two);
    assert!(
        msg.contains("does not match its reference `stale_ref.f`"),
        "{msg}"
    );
    assert_eq!(check(&one).trim(), "pass");
}

#[test]
fn an_edited_reference_is_what_the_next_test_process_runs() {
    let shared = Shared::new("edited");
    let root = shared.dir.join("refs");
    let check = || {
        let out = shared
            .child(&["check", "edited_ref.f"])
            .env("GOLDEN_REFERENCE_PATH", &root)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    module(&root, "edited_ref", "x * 1.0");
    assert_eq!(check().trim(), "pass");
    // The same size, most likely within the same second.
    module(&root, "edited_ref", "x * 3.0");
    let msg = check();
    assert!(
        msg.contains("does not match its reference `edited_ref.f`"),
        "{msg}"
    );
    module(&root, "edited_ref", "x.clone()");
    assert_eq!(check().trim(), "pass");
}

#[test]
fn a_served_copy_takes_large_tensors_through_shared_memory() {
    let shared = Shared::new("shm");
    // The copy answers the offer with an arena of its own, named by its pid.
    let info = shared.info();
    let pid = info["pid"].as_u64().unwrap();
    assert_eq!(info["shm"]["pid"].as_u64(), Some(pid), "{info}");
    assert!(
        info["shm"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(&format!("golden-{pid}-"))),
        "{info}"
    );
    let out = shared
        .child(&["check", "fault_ref.identity"])
        .env("GOLDEN_FAULT_CHILD_N", "100000")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pass",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("shared memory is not available"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A daemon that accepts connections but does not answer — stopped (SIGSTOP), or stuck — cost every
/// test process the whole start-up timeout (180 s), and the message then said start-up was slow
/// and to raise GOLDEN_START_TIMEOUT (#21 item 9). Now it is named and the check falls back to a
/// private worker at once; a daemon that is merely slow to answer gets a few seconds.
#[test]
fn a_stopped_daemon_is_named_and_checks_fall_back_to_a_private_worker() {
    let shared = Shared::new("stopped");
    let daemon = daemon_pid(&shared.info()) as u32;
    let signal = |name: &str| {
        Command::new("kill")
            .args([&format!("-{name}"), &daemon.to_string()])
            .status()
            .unwrap()
    };
    assert!(signal("STOP").success());
    // The signal takes effect when the daemon is next scheduled: wait until the process table
    // says it is stopped (a loaded machine may take a moment).
    let stat = format!("/proc/{daemon}/stat");
    let stopped = || {
        std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(|t| t == "T"))
                .unwrap_or(false)
        })
    };
    let waiting = std::time::Instant::now();
    while !stopped() && waiting.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(stopped(), "the daemon (pid {daemon}) did not stop");
    let started = std::time::Instant::now();
    let out = shared.run(&["check", "fault_ref.identity"]);
    let took = started.elapsed();
    signal("CONT");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pass");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the shared worker daemon (pid {daemon}) is stopped"
        )) && err.contains("using private workers"),
        "{err}"
    );
    // The fallback is immediate, not after a start-up timeout (the check itself takes a few
    // seconds: a private worker starts and imports torch).
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// A daemon that accepts connections (the kernel queues them) and never answers, without being
/// stopped: after a few seconds it is named as stuck and the check falls back (#21 item 9).
#[test]
fn a_daemon_that_never_answers_is_named_after_seconds_not_minutes() {
    use std::os::unix::fs::PermissionsExt;
    let shared = Shared::new("stuck");
    std::fs::create_dir_all(&shared.dir).unwrap();
    std::fs::set_permissions(&shared.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The socket the child's daemon would listen on, held by this test, which accepts nothing.
    let key = golden::internal::python::key::WorkerKey::from_env(None);
    let name = golden::internal::python::shared::socket_path(&key)
        .expect("a target folder")
        .file_name()
        .unwrap()
        .to_owned();
    let listener = std::os::unix::net::UnixListener::bind(shared.dir.join(name)).unwrap();
    let started = std::time::Instant::now();
    let out = shared.run(&["check", "fault_ref.identity"]);
    let took = started.elapsed();
    drop(listener);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pass");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the shared worker daemon (pid {}) accepted the connection but did not answer within 5 s: it is stuck",
            std::process::id()
        )) && err.contains("using private workers"),
        "{err}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// The stdout of `golden-fault-child check <reference>`, the reference found in `root`, with the
/// environment `vars` (the port multiplies by `GOLDEN_FAULT_CHILD_SCALE` when it is among them).
fn check_in(shared: &Shared, reference: &str, root: &Path, vars: &[(&str, &str)]) -> String {
    let mut child = shared.child(&["check", reference]);
    // Long enough that the processes of one test share one daemon however slow the machine.
    child
        .env("GOLDEN_SHARED_IDLE", "60")
        .env("GOLDEN_REFERENCE_PATH", root);
    for (name, value) in vars {
        child.env(name, value);
    }
    let out = child.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The daemon forked its copies with the environment of the test process that started it, so a
/// reference reading `os.environ` saw that process's values: a wrong port passed and the right one
/// failed (#31 item 1). A copy now runs with the environment of the test process it serves, and
/// variables read only when a reference runs do not need a daemon of their own.
#[test]
fn a_served_copy_runs_with_the_environment_of_its_test_process() {
    let shared = Shared::new("environ");
    let root = shared.dir.join("refs");
    module(
        &root,
        "scaled_ref",
        "x * float(__import__('os').environ['SCALE'])",
    );
    let check = |scale: &str, port: &str| {
        check_in(
            &shared,
            "scaled_ref.f",
            &root,
            &[("SCALE", scale), ("GOLDEN_FAULT_CHILD_SCALE", port)],
        )
    };
    // The first process starts the daemon with SCALE=2.
    let first = check("2", "2");
    assert!(first.starts_with("pass\n"), "{first}");
    let daemons = daemons_for(&shared.dir);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    // The next has SCALE=3: the port computing 2·x is wrong there, the one computing 3·x right.
    let wrong = check("3", "2");
    assert!(
        wrong.contains("does not match its reference `scaled_ref.f`"),
        "{wrong}"
    );
    let right = check("3", "3");
    assert!(right.starts_with("pass\n"), "{right}");
    assert!(!right.contains("not available"), "{right}");
    // One daemon served them all.
    assert_eq!(daemons_for(&shared.dir), daemons);
}

/// A variable read as the interpreter starts (here `PYTHONHASHSEED`, the seed of `hash` of a
/// string) cannot be given to a copy of a daemon that started under another value: such variables
/// choose the daemon (#31 item 1). Two test processes with different seeds each see their own.
#[test]
fn variables_read_as_python_starts_choose_the_daemon() {
    let shared = Shared::new("hashseed");
    let root = shared.dir.join("refs");
    module(&root, "hashed_ref", "x * float(hash('golden') % 1000 + 1)");
    // What `hash` gives under each seed, from an interpreter started with it.
    let python = golden::internal::describe::env::python().program;
    let expected = |seed: &str| {
        let out = Command::new(&python)
            .args(["-c", "print(hash('golden') % 1000 + 1)"])
            .env("PYTHONHASHSEED", seed)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (one, two) = (expected("1"), expected("2"));
    assert_ne!(one, two, "the seeds must give different hashes");
    let check = |seed: &str, scale: &str| {
        check_in(
            &shared,
            "hashed_ref.f",
            &root,
            &[
                ("PYTHONHASHSEED", seed),
                ("GOLDEN_FAULT_CHILD_SCALE", scale),
            ],
        )
    };
    let first = check("1", &one);
    assert!(first.starts_with("pass\n"), "{first}");
    let second = check("2", &two);
    assert!(second.starts_with("pass\n"), "{second}");
    assert_eq!(daemons_for(&shared.dir).len(), 2);
}

/// A reference reads files relative to the working directory of its test process.
#[test]
fn a_served_copy_works_in_the_folder_of_its_test_process() {
    let shared = Shared::new("cwd");
    let root = shared.dir.join("refs");
    module(&root, "cwd_ref", "x * float(open('scale.txt').read())");
    let check = |scale: &str| {
        let dir = shared.dir.join(format!("cwd{scale}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("scale.txt"), scale).unwrap();
        let out = shared
            .child(&["check", "cwd_ref.f"])
            .current_dir(&dir)
            .env("GOLDEN_SHARED_IDLE", "60")
            .env("GOLDEN_REFERENCE_PATH", &root)
            .env("GOLDEN_FAULT_CHILD_SCALE", scale)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(check("2").trim(), "pass");
    assert_eq!(check("3").trim(), "pass");
}

/// The socket a check of `golden-fault-child` connects to, with `vars` set.
fn socket_of(shared: &Shared, vars: &[(&str, &Path)]) -> PathBuf {
    let mut child = shared.child(&["socket"]);
    for (name, value) in vars {
        child.env(name, value);
    }
    let out = child.output().unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A process of the user that is not golden's daemon listening at the shared worker's socket (it
/// answers and hangs up, as a web server would) made a right port fail with "the Python
/// interpreter wrote HTTP/1.1 ... before golden's worker answered" (#31 item 12). It is not used:
/// the check falls back to a private worker and says why.
#[test]
fn a_process_that_is_not_golden_at_the_socket_is_not_used() {
    use std::io::{Read, Write};
    let shared = Shared::new("squatter");
    let socket = socket_of(&shared, &[]);
    std::fs::create_dir_all(&shared.dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let server = std::thread::spawn(move || {
        let mut served = 0;
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .unwrap();
                    let mut request = [0u8; 64];
                    let _ = stream.read(&mut request);
                    let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
                    served += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        served
    });
    let out = shared.run(&["check", "fault_ref.identity"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let served = server.join().unwrap();
    assert!(
        served >= 1,
        "the check never connected to {}",
        socket.display()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pass",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the process (pid {}) listening at {} is not golden's shared worker",
            std::process::id(),
            socket.display()
        )) && err.contains("using private workers"),
        "{err}"
    );
}

/// A daemon of golden's Python side started for other import roots (another golden build, or one
/// started by hand) listening at this check's socket answered for it: the reference was found on
/// its import path, not the check's, and a right port failed (#31 item 12). Its copy's `hello` now
/// says which daemon it is, and the check does not use another.
#[test]
fn a_daemon_started_for_other_roots_at_the_socket_is_not_used() {
    let shared = Shared::new("planted");
    let (ours, theirs) = (shared.dir.join("ours"), shared.dir.join("theirs"));
    module(&ours, "planted_ref", "x.clone()");
    module(&theirs, "planted_ref", "x * 2");
    let socket = socket_of(&shared, &[("GOLDEN_REFERENCE_PATH", &ours)]);
    // Made as golden makes it: private to this user.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference_py");
    let python = golden::internal::describe::env::python().program;
    let planted = Command::new(&python)
        .args(["-m", "golden_ref.daemon", "--idle", "60", "--socket"])
        .arg(&socket)
        .env(
            "PYTHONPATH",
            std::env::join_paths([theirs.as_path(), bundled.as_path()]).unwrap(),
        )
        .output()
        .expect("the planted daemon starts");
    assert!(
        String::from_utf8_lossy(&planted.stdout).starts_with("ready"),
        "{planted:?}"
    );
    let out = shared
        .child(&["check", "planted_ref.f"])
        .env("GOLDEN_REFERENCE_PATH", &ours)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pass",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not the shared worker this test process needs")
            && err.contains("using private workers"),
        "{err}"
    );
}
