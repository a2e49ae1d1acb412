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
        // Leave no daemon behind, even when a test failed: it listens on a socket in `dir`.
        let _ = Command::new("pkill")
            .args(["-f", "--", &format!("--socket {}", self.dir.display())])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn daemon_pid(info: &Json) -> u64 {
    info["daemon_pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("not served by the daemon: {info}"))
}

fn daemons_for(dir: &Path) -> usize {
    let pattern = format!("--socket {}", dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            processes::alive(*pid) && cmd.contains(&pattern)
        })
        .count()
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
    assert_eq!(daemons_for(&shared.dir), 1);
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
