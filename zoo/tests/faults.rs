//! Faults of the reference's process and of its values end in a clear failure — never a pass, a
//! hang or a leaked process — and the next check in the same test process works. The faulty
//! references are in `reference_py/fault_ref`.
//!
//! The tests take turns (`SERIAL`): after each fault, the only workers this process may have are
//! the pool's idle ones, which the process table must confirm.

mod common;

use common::processes;
use golden::internal::describe::env::Mode;
use golden::{Dist, Failure, IntoOutputs, Layer, PortInputs};
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn layer(reference: &str) -> Layer {
    Layer::function("port", reference)
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .mode(Mode::Live)
}

fn identity(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).clone().into_outputs()
}

/// The shared memory this process holds that no idle worker accounts for: arenas of workers
/// that are gone, and more arenas of its own than one per idle worker.
fn stray_arenas(idle: &[u32]) -> Vec<String> {
    let me = std::process::id();
    let held = processes::arenas_of(me);
    let own = held
        .iter()
        .filter(|n| processes::arena_creator(n) == Some(me))
        .count();
    let mut stray: Vec<String> = held
        .iter()
        .filter(|n| processes::arena_creator(n).is_none_or(|p| p != me && !idle.contains(&p)))
        .cloned()
        .collect();
    if own > idle.len() {
        stray.push(format!(
            "{own} arenas of this process for {} idle workers",
            idle.len()
        ));
    }
    stray
}

/// No worker of this process is running except the pool's idle ones, and no process a reference
/// started (as `fault_ref` records them) except in the process group of an idle worker; no shared
/// memory is held but that of idle workers.
fn assert_no_stray_workers() {
    let me = std::process::id();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let idle = golden::internal::python::worker::pool().idle_pids();
        let arenas = stray_arenas(&idle);
        let stray: Vec<u32> = processes::workers_of(me)
            .into_iter()
            .filter(|p| !idle.contains(p))
            .collect();
        let helpers: Vec<u32> = processes::recorded_pids(&processes::fault_pid_file(me))
            .into_iter()
            .filter(|&p| {
                processes::alive(p) && !processes::group_of(p).is_some_and(|g| idle.contains(&g))
            })
            .collect();
        if stray.is_empty() && helpers.is_empty() && arenas.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "workers {stray:?} are still running and not in the pool (idle: {idle:?}), \
             processes {helpers:?} that references started, and shared memory {arenas:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run a check that must fail; then a good check must pass in this process and no worker may be
/// left over. Returns the failure's message.
fn fault(layer: &Layer, port: &golden::Port<'_>) -> String {
    let _turn = take_turn();
    fault_in_turn(layer, port)
}

/// [`fault`], the turn already taken.
fn fault_in_turn(layer: &Layer, port: &golden::Port<'_>) -> String {
    let msg = match golden::check(layer, port) {
        Ok(_) => panic!("`{}` passed", layer.reference()),
        Err(f) => f.to_string(),
    };
    next_check_works();
    assert_no_stray_workers();
    msg
}

/// A reference that misbehaves without breaking anything: the check passes.
fn harmless(reference: &str) {
    let _turn = take_turn();
    golden::check(&layer(reference), &identity).unwrap_or_else(|f| panic!("{f}"));
    next_check_works();
    assert_no_stray_workers();
}

/// The tests' turn, with private workers: they are this process's children, which the process
/// table shows (the shared worker's copies are covered by `tests/shared_worker.rs`).
fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    golden::internal::python::shared::set_enabled(Some(false));
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn next_check_works() {
    golden::check(&layer("fault_ref.identity"), &identity)
        .unwrap_or_else(|f| panic!("after a fault, a good check failed:\n{f}"));
}

fn worker_failure(f: &Failure) -> bool {
    matches!(f.kind, golden::FailureKind::Worker(_))
}

#[test]
fn a_reference_that_exits_is_reported_with_its_exit_code() {
    let msg = fault(&layer("fault_ref.exits"), &identity);
    assert!(
        msg.starts_with("golden: `port`: the reference `fault_ref.exits` failed in f32:"),
        "{msg}"
    );
    assert!(
        msg.contains("died with exit code 3 while running `fault_ref.exits` on dims n="),
        "{msg}"
    );
    // Reported as is, not shrunk: each retry would start Python again.
    assert!(!msg.contains("shrunk"), "{msg}");
}

#[test]
fn a_segfault_shows_the_python_stack_where_it_happened() {
    let msg = fault(&layer("fault_ref.segfaults"), &identity);
    assert!(msg.contains("died with signal 11 (SIGSEGV)"), "{msg}");
    // faulthandler prints the Python stack of the crash to stderr, which the message quotes.
    assert!(
        msg.contains("Fatal Python error: Segmentation fault") && msg.contains("in segfaults"),
        "{msg}"
    );
}

/// A crash in golden's float64 evaluation of the reference was reported like any crash, with
/// nothing to say that the reference runs fine in the case dtype (#21 item 14).
#[test]
fn a_crash_in_the_float64_evaluation_is_named_as_such() {
    let msg = fault(&layer("fault_ref.segfaults_in_float64"), &identity);
    assert!(msg.contains("died with signal 11 (SIGSEGV)"), "{msg}");
    assert!(
        msg.contains("it died in golden's float64 evaluation of the reference"),
        "{msg}"
    );
}

/// A reference that ends only in golden's float64 evaluation without a Python stack (an exit, a
/// SIGKILL from the out-of-memory killer) was reported like any death, with nothing to say that it
/// runs in the case dtype (#31, minor): the stack on stderr is no longer how golden tells the
/// phase; the worker says where it is as it goes.
#[test]
fn a_death_in_the_float64_evaluation_is_named_as_such_without_a_stack() {
    for (reference, status) in [
        ("fault_ref.exits_in_float64", "died with exit code 3"),
        (
            "fault_ref.killed_in_float64",
            "died with signal 9 (SIGKILL)",
        ),
    ] {
        let msg = fault(&layer(reference), &identity);
        assert!(msg.contains(status), "{msg}");
        assert!(
            msg.contains("it died in golden's float64 evaluation of the reference"),
            "{msg}"
        );
    }
    let msg = fault(
        &layer("fault_ref.sleeps_in_float64").timeout(2.0),
        &identity,
    );
    assert!(
        msg.contains("did not answer within 2 s") && msg.contains("in golden's float64 evaluation"),
        "{msg}"
    );
}

/// Only a failure of the port, reproducible from its case, is saved in proptest's regressions
/// file for the check to replay first: a timeout, a dead worker or a reference that raises were
/// saved too, and the user asked to commit them (#31 item 13).
#[test]
fn only_the_port_s_failures_are_saved_for_replay() {
    let _turn = take_turn();
    let scratch = common::Scratch::new("f_regressions");
    let saved = || {
        std::fs::read_to_string(scratch.dir.join("proptest-regressions/check.txt"))
            .unwrap_or_default()
    };
    let declared = |l: Layer| l.declared_at(scratch.declared);
    let slow_port = |i: &PortInputs| {
        std::thread::sleep(Duration::from_secs(4));
        i.tensor(0).clone().into_outputs()
    };
    for (layer, port) in [
        (
            layer("fault_ref.sleeps").timeout(2.0),
            &identity as &golden::Port<'_>,
        ),
        (layer("fault_ref.exits"), &identity),
        (layer("fault_ref.raises"), &identity),
        (layer("fault_ref.identity").timeout(1.0), &slow_port),
    ] {
        let reference = layer.reference().to_string();
        let failure =
            golden::check(&declared(layer), port).expect_err(&format!("`{reference}` must fail"));
        assert!(
            saved().is_empty(),
            "`{reference}` ({failure}) saved a case:\n{}",
            saved()
        );
    }
    // A wrong port's failure is the port's: saved, once.
    let wrong = |i: &PortInputs| i.tensor(0).affine(2.0, 0.0).into_outputs();
    assert!(golden::check(&declared(layer("fault_ref.identity")), &wrong).is_err());
    let lines: Vec<String> = saved()
        .lines()
        .filter(|l| l.starts_with("cc "))
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    next_check_works();
    assert_no_stray_workers();
}

#[test]
fn a_reference_that_hangs_is_killed_at_the_check_s_timeout() {
    let started = std::time::Instant::now();
    let msg = fault(&layer("fault_ref.sleeps").timeout(2.0), &identity);
    assert!(
        msg.contains("the reference did not answer within 2 s while running `fault_ref.sleeps`"),
        "{msg}"
    );
    assert!(
        msg.contains("the worker was killed and will be replaced"),
        "{msg}"
    );
    assert!(msg.contains("`timeout = <seconds>`"), "{msg}");
    // Not a timing assertion: the reference sleeps an hour, so an unkilled worker never returns.
    assert!(started.elapsed() < Duration::from_secs(600));
}

#[test]
fn printing_to_stdout_does_not_corrupt_the_protocol() {
    harmless("fault_ref.prints");
}

#[test]
fn megabytes_on_stderr_do_not_block_the_worker() {
    harmless("fault_ref.floods_stderr");
}

#[test]
fn nan_in_the_reference_only_is_a_mismatch_that_says_so() {
    let msg = fault(&layer("fault_ref.returns_nan"), &identity);
    assert!(
        msg.contains("does not match its reference `fault_ref.returns_nan`"),
        "{msg}"
    );
    assert!(
        msg.contains("first NaN/Inf on one side only at [0]"),
        "{msg}"
    );
    assert!(msg.contains("NaN: port 0, reference 1"), "{msg}");
}

#[test]
fn a_wrong_shape_is_named_with_both_shapes() {
    let layer = Layer::function("port", "fault_ref.returns_wrong_shape")
        .dim("a", 2, 4)
        .dim("b", 2, 4)
        .arg("x", ["a", "b"], Dist::default())
        .cases(4)
        .mode(Mode::Live);
    let msg = fault(&layer, &identity);
    assert!(
        msg.contains("leaf `out`: shape f32 [2, 2] but the reference's is f32 [4]"),
        "{msg}"
    );
}

#[test]
fn a_python_scalar_and_none_are_not_tensors() {
    let msg = fault(&layer("fault_ref.returns_float"), &identity);
    assert!(msg.contains("`out` is a builtins.float"), "{msg}");
    let msg = fault(&layer("fault_ref.returns_none"), &identity);
    assert!(
        msg.contains("`out` is None where a tensor was expected"),
        "{msg}"
    );
}

#[test]
fn a_dict_without_a_key_the_port_returns_names_the_key() {
    let port = |i: &PortInputs| {
        let x = i.tensor(0);
        let mut out = std::collections::BTreeMap::new();
        out.insert("double".to_string(), (x * 2.0).map_err(|e| e.to_string())?);
        out.insert("half".to_string(), (x / 2.0).map_err(|e| e.to_string())?);
        out.into_outputs()
    };
    let msg = fault(&layer("fault_ref.returns_dict_without_half"), &port);
    // Named on the first case, unshrunk: no case changes what a port returns.
    assert!(
        msg.contains("leaf `out.half` (f32 [")
            && msg.contains("]): the port returns it, the reference does not"),
        "{msg}"
    );
    assert!(msg.contains("said on the first case"), "{msg}");
}

#[test]
fn a_worker_fault_is_a_worker_failure_not_a_mismatch() {
    let _turn = take_turn();
    let f = golden::check(&layer("fault_ref.exits"), &identity).unwrap_err();
    assert!(worker_failure(&f), "{f:?}");
    drop(_turn);
}

/// The test process ends — by a panic, `std::process::exit`, or returning from main — while a
/// worker is busy in a reference that sleeps for an hour: the worker must go too.
fn child_ends(how: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_golden-fault-child"))
        .arg(how)
        .env("GOLDEN_SHARED_WORKER", "never")
        .stderr(std::process::Stdio::null())
        .output()
        .expect("the child runs");
    let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(!pids.is_empty(), "the child started no worker: {out:?}");
    let left = processes::wait_gone(&pids, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "workers {left:?} outlived their test process (ended by {how})"
    );
}

#[test]
fn workers_end_with_a_test_process_that_panics() {
    child_ends("panic");
}

#[test]
fn workers_end_with_a_test_process_that_calls_exit() {
    child_ends("exit");
}

#[test]
fn workers_end_with_a_test_process_that_returns() {
    child_ends("return");
}

/// The processes `fault_ref`'s references start in a test: whatever is left of them is killed when
/// the test ends, passed or failed, so that a failing test leaves nothing for an hour.
struct Helpers {
    file: std::path::PathBuf,
}

impl Helpers {
    /// For the private workers of this process.
    fn of_this_process() -> Helpers {
        Helpers::at(processes::fault_pid_file(std::process::id()))
    }

    fn at(file: std::path::PathBuf) -> Helpers {
        let _ = std::fs::remove_file(&file);
        Helpers { file }
    }

    fn pids(&self) -> Vec<u32> {
        processes::recorded_pids(&self.file)
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        for pid in self.pids().into_iter().filter(|&p| processes::alive(p)) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// [`fault`] for a reference that starts processes which live for an hour and hold the worker's
/// pipes: the check must not wait for them. If it has not returned after two minutes (it takes
/// seconds), they are killed to free the test, which fails.
fn fault_with_helpers(reference: &str, timeout: f64) -> String {
    let _turn = take_turn();
    let helpers = Helpers::of_this_process();
    let (tx, rx) = std::sync::mpsc::channel();
    let reference = reference.to_string();
    let check = std::thread::spawn(move || {
        let _ = tx.send(fault_in_turn(
            &layer(&reference).timeout(timeout),
            &identity,
        ));
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(msg) => {
            check.join().unwrap();
            assert!(!helpers.pids().is_empty(), "the reference started nothing");
            msg
        }
        Err(_) => {
            let started = helpers.pids();
            drop(helpers);
            let _ = check.join();
            panic!("the check was still waiting after 120 s for processes {started:?} that the reference started")
        }
    }
}

#[test]
fn a_reference_that_forks_and_exits_is_reported_as_dead_at_once() {
    // The forked copy holds every descriptor of the worker, its pipes included: the worker's death
    // must be seen from the process, not from the pipes, and the copy must end with it.
    let msg = fault_with_helpers("fault_ref.forks_then_exits", 60.0);
    assert!(
        msg.contains("died with exit code 3 while running `fault_ref.forks_then_exits`"),
        "{msg}"
    );
}

#[test]
fn a_reference_that_starts_a_helper_and_exits_is_reported_as_dead_at_once() {
    let msg = fault_with_helpers("fault_ref.spawns_then_exits", 60.0);
    assert!(
        msg.contains("died with exit code 3 while running `fault_ref.spawns_then_exits`"),
        "{msg}"
    );
}

#[test]
fn a_hanging_reference_s_helper_is_killed_with_its_worker() {
    let msg = fault_with_helpers("fault_ref.spawns_then_hangs", 2.0);
    assert!(
        msg.contains("did not answer within 2 s while running `fault_ref.spawns_then_hangs`"),
        "{msg}"
    );
}

/// Run `golden-fault-child` with private workers and these variables.
fn child(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_golden-fault-child"));
    command.args(args).env("GOLDEN_SHARED_WORKER", "never");
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("the child runs")
}

/// The results printed by `golden-fault-child checks`, then its stray workers.
fn checks(args: &[&str], envs: &[(&str, &str)]) -> (Vec<String>, String) {
    let out = child(&[&["checks"], args].concat(), envs);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut parts: Vec<String> = stdout
        .split("----\n")
        .map(|p| p.trim().to_string())
        .collect();
    let stray = parts.pop().unwrap_or_default();
    (parts, stray)
}

#[test]
fn helpers_of_passing_references_end_with_their_test_process() {
    let helpers = Helpers::at(
        std::env::temp_dir().join(format!("golden-fault-pids-passing-{}", std::process::id())),
    );
    let file = helpers.file.display().to_string();
    let (results, stray) = checks(
        &[
            "fault_ref.spawns_and_returns",
            "fault_ref.forks_and_returns",
        ],
        &[("GOLDEN_FAULT_PIDS", &file)],
    );
    assert_eq!(results, ["pass", "pass"], "{stray}");
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
fn a_reference_that_reads_stdin_reads_end_of_file() {
    let msg = fault(&layer("fault_ref.reads_stdin").timeout(60.0), &identity);
    assert!(!msg.contains("did not answer"), "{msg}");
    assert!(
        msg.contains("EOFError: EOF when reading a line")
            && msg.contains("input(\"press enter: \")"),
        "{msg}"
    );
}

#[test]
fn a_reference_that_closes_stdin_does_not_break_the_protocol() {
    harmless("fault_ref.closes_stdin");
}

/// A wrapper script that prints a banner before it runs golden's interpreter.
fn printing_wrapper(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let wrapper = dir.join("python");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"Welcome to the lab's Python (module load python/3.11)\"\nexec {} \"$@\"\n",
            golden::internal::describe::env::python().program.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

#[test]
fn an_interpreter_that_prints_before_the_protocol_fails_at_once() {
    let scratch = common::Scratch::new("printing-wrapper");
    let wrapper = printing_wrapper(&scratch.dir);
    let started = std::time::Instant::now();
    let out = child(
        &["check", "fault_ref.identity"],
        &[
            ("GOLDEN_PYTHON", &wrapper.display().to_string()),
            ("GOLDEN_START_TIMEOUT", "120"),
        ],
    );
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains(&format!("`{}`", wrapper.display()))
            && msg.contains("Welcome to the lab's Python")
            && msg.contains("sitecustomize"),
        "{msg}"
    );
    assert!(!msg.contains("did not"), "{msg}");
    // Not a measurement: a worker that waited for its frame would take the whole 120 s.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}: {msg}",
        started.elapsed()
    );
}

#[test]
fn a_sitecustomize_that_prints_fails_at_once_and_is_named() {
    let scratch = common::Scratch::new("printing-sitecustomize");
    std::fs::write(
        scratch.dir.join("sitecustomize.py"),
        "print('sitecustomize: proxy configured')\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = child(
        &["check", "fault_ref.identity"],
        &[
            ("GOLDEN_REFERENCE_PATH", &scratch.dir.display().to_string()),
            ("GOLDEN_START_TIMEOUT", "120"),
        ],
    );
    let msg = String::from_utf8_lossy(&out.stdout);
    assert!(
        msg.contains("sitecustomize: proxy configured") && msg.contains("before golden's worker"),
        "{msg}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}: {msg}",
        started.elapsed()
    );
}

#[test]
fn an_answer_over_the_frame_limit_is_refused_with_the_leaf_and_the_limit() {
    // The worker's limit lowered to 8 MiB; the reference's output is 4 MiB of f32, 24 MiB with its
    // float64 value and the three float32 parts of its rounding estimate.
    let (results, stray) = checks(
        &["fault_ref.returns_large", "fault_ref.identity"],
        &[("GOLDEN_MAX_FRAME", "8388608")],
    );
    let msg = &results[0];
    assert!(
        msg.contains("`out` (f32 [1048576], 4.0 MiB)")
            && msg.contains("24.0 MiB")
            && msg.contains("frame limit of 8.0 MiB"),
        "{msg}"
    );
    assert!(
        !msg.contains("ProtocolError") && !msg.contains("died"),
        "{msg}"
    );
    assert_eq!(results[1], "pass");
    assert_eq!(stray, "stray workers: []");
}

/// `golden-fault-child check fault_ref.identity` with one variable set: its stdout.
fn with_env(name: &str, value: &str) -> String {
    let out = child(&["check", "fault_ref.identity"], &[(name, value)]);
    assert!(
        out.status.success(),
        "{name}={value}: the child failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_invalid_timeout_names_the_variable_and_the_accepted_form() {
    for value in ["-1", "nan", "abc", "1e400x"] {
        let msg = with_env("GOLDEN_TIMEOUT", value);
        assert!(
            msg.contains(&format!("GOLDEN_TIMEOUT={value:?}"))
                && msg.contains("seconds")
                && msg.contains("0 or inf for no limit"),
            "{value}: {msg}"
        );
    }
    for value in ["-1", "x"] {
        let msg = with_env("GOLDEN_START_TIMEOUT", value);
        assert!(
            msg.contains(&format!("GOLDEN_START_TIMEOUT={value:?}")),
            "{value}: {msg}"
        );
    }
}

#[test]
fn a_timeout_of_zero_or_inf_means_no_limit() {
    for value in ["0", "inf"] {
        assert_eq!(with_env("GOLDEN_TIMEOUT", value).trim(), "pass", "{value}");
    }
}

/// `GOLDEN_MAX_FRAME=-1` and `GOLDEN_PARENT_PID=abc` were ignored without a word (#31, minor):
/// every variable golden declares is read before any case, and a value it cannot read is named.
#[test]
fn an_unreadable_internal_variable_is_named_too() {
    for (name, value) in [
        ("GOLDEN_MAX_FRAME", "-1"),
        ("GOLDEN_MAX_FRAME", "lots"),
        ("GOLDEN_PARENT_PID", "abc"),
    ] {
        let msg = with_env(name, value);
        assert!(
            msg.contains(&format!("{name}={value:?}")) && !msg.starts_with("pass"),
            "{name}={value}: {msg}"
        );
    }
}

#[test]
fn an_invalid_worker_count_names_the_variable() {
    for value in ["abc", "0", "-2"] {
        let msg = with_env("GOLDEN_WORKERS", value);
        assert!(
            msg.contains(&format!("GOLDEN_WORKERS={value:?}")) && msg.contains("positive"),
            "{value}: {msg}"
        );
    }
}

// --- shared memory ------------------------------------------------------------------------------

/// A layer whose input, 100,000 f32 (400 KB), travels through shared memory.
fn large(reference: &str) -> Layer {
    Layer::function("port", reference)
        .dim("n", 100_000, 100_000)
        .arg("x", ["n"], Dist::default())
        .cases(2)
        .mode(Mode::Live)
}

#[test]
fn large_tensors_travel_through_shared_memory_both_ways() {
    let _turn = take_turn();
    golden::check(&large("fault_ref.identity"), &identity).unwrap_or_else(|f| panic!("{f}"));
    let key = golden::internal::python::key::WorkerKey::from_env(Some(env!("CARGO_MANIFEST_DIR")));
    let worker = golden::internal::python::worker::pool()
        .check_out(&key)
        .unwrap();
    assert_eq!(
        worker.shared_memory(),
        Some(golden::internal::python::shm::DEFAULT_MIN),
        "{}",
        worker.info
    );
    // Both arenas: this process's (requests) and the worker's (answers), mapped here.
    let held = processes::arenas_of(std::process::id());
    assert!(
        held.iter()
            .any(|n| processes::arena_creator(n) == Some(worker.pid())),
        "{held:?}"
    );
    drop(worker);
    assert_no_stray_workers();
}

#[test]
fn an_answer_naming_a_file_as_its_shared_memory_is_a_protocol_error() {
    let msg = fault(&large("fault_ref.names_a_bogus_arena"), &identity);
    assert!(msg.contains("the worker broke the protocol"), "{msg}");
    assert!(
        msg.contains("fault_ref/__init__.py\", not the memfd `golden-"),
        "{msg}"
    );
    assert!(
        msg.contains("while running `fault_ref.names_a_bogus_arena`"),
        "{msg}"
    );
}

#[test]
fn a_worker_killed_with_a_request_in_shared_memory_leaves_none_behind() {
    // `fault` checks that no arena of the killed worker is held, nor any of this process's but
    // the idle workers' ones.
    let msg = fault(&large("fault_ref.sleeps").timeout(2.0), &identity);
    assert!(msg.contains("did not answer within 2 s"), "{msg}");
}

/// `golden-fault-child checks` on a 400 KB input, twice, with a `sitecustomize.py` in the
/// worker's import path: its stderr.
fn large_checks_with_sitecustomize(name: &str, sitecustomize: &str) -> String {
    let scratch = common::Scratch::new(name);
    std::fs::write(scratch.dir.join("sitecustomize.py"), sitecustomize).unwrap();
    let root = scratch.dir.display().to_string();
    let out = child(
        &["checks", "fault_ref.identity", "fault_ref.identity"],
        &[
            ("GOLDEN_REFERENCE_PATH", root.as_str()),
            ("GOLDEN_FAULT_CHILD_N", "100000"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout.matches("pass\n----").count(),
        2,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn without_memfd_large_tensors_travel_inline_and_it_is_said_once() {
    let stderr = large_checks_with_sitecustomize("no-memfd", "import os\ndel os.memfd_create\n");
    let said = "golden: shared memory is not available for tensors (the worker cannot use it: \
                this Python has no os.memfd_create); large tensors travel through the worker's pipe";
    assert_eq!(stderr.matches(said).count(), 1, "{stderr}");
}

#[test]
fn a_worker_whose_shared_memory_cannot_grow_answers_inline_and_it_is_said_once() {
    // Memory that runs out: allocating more than 1 MiB fails as a full tmpfs does.
    let stderr = large_checks_with_sitecustomize(
        "full-shm",
        "import errno, os\n\
         _fallocate = os.posix_fallocate\n\
         def posix_fallocate(fd, offset, length):\n\
         \x20   if length > 1 << 20:\n\
         \x20       raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n\
         \x20   return _fallocate(fd, offset, length)\n\
         os.posix_fallocate = posix_fallocate\n",
    );
    let said = "golden: shared memory is not available for tensors (the worker's own: growing \
                shared memory to ";
    assert_eq!(stderr.matches(said).count(), 1, "{stderr}");
    assert!(
        stderr.contains(" bytes: No space left on device)"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("shared memory is not available").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn golden_shm_off_sends_everything_inline_and_an_invalid_value_is_named() {
    let stdout = with_env("GOLDEN_SHM", "off");
    assert_eq!(stdout.trim(), "pass");
    let msg = with_env("GOLDEN_SHM", "sometimes");
    assert!(
        msg.contains("GOLDEN_SHM=\"sometimes\" is not one of auto, off"),
        "{msg}"
    );
}
