//! Faults of the reference's process and of its values end in a clear failure — never a pass, a
//! hang or a leaked process — and the next check in the same test process works. The faulty
//! references are in `reference_py/fault_ref`.
//!
//! The tests take turns (`SERIAL`): after each fault, the only workers this process may have are
//! the pool's idle ones, which the process table must confirm.

mod common;

use common::processes;
use golden::describe::env::Mode;
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

/// No worker of this process is running except the pool's idle ones.
fn assert_no_stray_workers() {
    let me = std::process::id();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let idle = golden::python::worker::pool().idle_pids();
        let stray: Vec<u32> = processes::workers_of(me)
            .into_iter()
            .filter(|p| !idle.contains(p))
            .collect();
        if stray.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "workers {stray:?} are still running and not in the pool (idle: {idle:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run a check that must fail; then a good check must pass in this process and no worker may be
/// left over. Returns the failure's message.
fn fault(layer: &Layer, port: &golden::Port<'_>) -> String {
    let _turn = take_turn();
    let msg = match golden::check(layer, port) {
        Ok(_) => panic!("`{}` passed", layer.reference),
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
    golden::python::shared::set_enabled(Some(false));
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
    assert!(
        msg.contains("leaf `out.half` (f32 [1]): the port returns it, the reference does not"),
        "{msg}"
    );
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
