//! A test process that ends while golden's workers are alive, for `tests/faults.rs`: it starts a
//! check whose reference sleeps (so one worker is busy and cannot read its stdin), prints the pids
//! of its workers, then ends as its argument says: `panic`, `exit` (std::process::exit) or
//! `return`. The workers must not outlive it.

#[path = "../common/processes.rs"]
#[allow(dead_code)]
mod processes;

use golden::{Dist, IntoOutputs, Layer, PortInputs};
use std::time::{Duration, Instant};

fn main() {
    let how = std::env::args().nth(1).unwrap_or_default();
    std::thread::spawn(|| {
        let layer = Layer::function("busy", "fault_ref.sleeps")
            .dim("n", 1, 4)
            .arg("x", ["n"], Dist::default())
            .mode(golden::env::Mode::Live);
        let port = |i: &PortInputs| i.tensor(0).clone().into_outputs();
        let _ = golden::check(&layer, &port);
    });
    // Wait until a worker is up and busy in the reference.
    let deadline = Instant::now() + Duration::from_secs(120);
    let me = std::process::id();
    let workers = loop {
        let w = processes::workers_of(me);
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
    match how.as_str() {
        "panic" => panic!("the test process panics with a busy worker"),
        "exit" => std::process::exit(0),
        _ => {}
    }
}
