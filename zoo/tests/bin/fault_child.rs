//! A test process for `tests/faults.rs` and `tests/shared_worker.rs`, by its first argument:
//!
//! * `panic`, `exit`, `return`: start a check whose reference sleeps (so a worker is busy and
//!   cannot read its input), print the pids of this process's workers, then end that way
//!   (`std::process::exit` for `exit`). The workers must not outlive it.
//! * `info`: borrow a worker and print its `hello` answer (JSON).
//! * `socket`: print the path of the shared worker's socket that a check would connect to.
//! * `check <reference> [timeout]`: check `reference` against an identity port and print `pass` or
//!   the failure.
//! * `checks <reference>[@timeout]...`: check each in turn in this process, printing each result
//!   followed by a line `----`, then `stray workers: <pids>`: this process's workers that are not
//!   idle in the pool (private workers only).
//!
//! The checks' input is `x: [n]` with `n` in 1..=4, or exactly `GOLDEN_FAULT_CHILD_N` (large
//! inputs, for shared memory). The port returns its input, times `GOLDEN_FAULT_CHILD_SCALE` when
//! that is set.

#[path = "../common/processes.rs"]
#[allow(dead_code)]
mod processes;

use golden::{Dist, IntoOutputs, Layer, PortInputs};
use std::time::{Duration, Instant};

/// `pass`, or the failure's message.
fn identity_check(reference: &str, timeout: Option<f64>) -> String {
    let n: Option<usize> = std::env::var("GOLDEN_FAULT_CHILD_N")
        .ok()
        .and_then(|n| n.parse().ok());
    let mut layer = Layer::function("child", reference)
        .dim("n", n.unwrap_or(1), n.unwrap_or(4))
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .mode(golden::internal::describe::env::Mode::Live);
    if let Some(t) = timeout {
        layer = layer.timeout(t);
    }
    let scale: Option<f64> = std::env::var("GOLDEN_FAULT_CHILD_SCALE")
        .ok()
        .map(|s| s.parse().expect("GOLDEN_FAULT_CHILD_SCALE is a number"));
    let port = move |i: &PortInputs| match scale {
        Some(s) => i.tensor(0).affine(s, 0.0).into_outputs(),
        None => i.tensor(0).clone().into_outputs(),
    };
    match golden::check(&layer, &port) {
        Ok(_) => "pass".into(),
        Err(f) => f.to_string(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let how = args.first().map(String::as_str).unwrap_or_default();
    match how {
        "info" => {
            let key = golden::internal::python::key::WorkerKey::from_env(None);
            let worker = golden::internal::python::worker::pool()
                .check_out(&key)
                .expect("a worker");
            println!("{}", worker.info);
            return;
        }
        "socket" => {
            let key = golden::internal::python::key::WorkerKey::from_env(None);
            let socket = golden::internal::python::shared::socket_path(&key).expect("a folder");
            println!("{}", socket.display());
            return;
        }
        "check" => {
            let timeout = args.get(2).and_then(|t| t.parse().ok());
            println!("{}", identity_check(&args[1], timeout));
            return;
        }
        "checks" => {
            for arg in &args[1..] {
                let (reference, timeout) = match arg.split_once('@') {
                    Some((r, t)) => (r, t.parse().ok()),
                    None => (arg.as_str(), None),
                };
                println!("{}\n----", identity_check(reference, timeout));
            }
            let idle = golden::internal::python::worker::pool().idle_pids();
            let stray: Vec<u32> = processes::workers_of(std::process::id())
                .into_iter()
                .filter(|p| !idle.contains(p))
                .collect();
            println!("stray workers: {stray:?}");
            return;
        }
        _ => {}
    }
    std::thread::spawn(|| {
        let _ = identity_check("fault_ref.sleeps", None);
    });
    // Wait until a worker is up and busy in the reference.
    let deadline = Instant::now() + Duration::from_secs(120);
    let me = std::process::id();
    // Private workers are children of this process; the shared worker's copies are the daemon's,
    // each with a log file in the (per-test) shared folder.
    let shared_copies = || -> Vec<u32> {
        let Some(dir) = golden::internal::python::shared::directory() else {
            return Vec::new();
        };
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("worker-")?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let workers = loop {
        let w = if golden::internal::python::shared::enabled() {
            shared_copies()
        } else {
            processes::workers_of(me)
        };
        if !w.is_empty() || Instant::now() > deadline {
            break w;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "{}",
        workers
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    match how {
        "panic" => panic!("the test process panics with a busy worker"),
        "exit" => std::process::exit(0),
        _ => {}
    }
}
