//! Many checks on many threads share the worker pool (at most `GOLDEN_WORKERS` interpreters per
//! process, started when a check needs one and none is idle). Answers never go to the wrong check
//! (each request carries an id the answer must repeat) and nothing deadlocks, also while one of the
//! checks kills its worker.

use golden::internal::describe::env::Mode;
use golden::{Dist, IntoOutputs, Layer, PortInputs};
use std::sync::Arc;

type PortFn = fn(&PortInputs) -> Result<golden::Outputs, String>;

/// References whose answers differ on every input, with their ports: a mixed-up answer fails.
const PAIRS: &[(&str, PortFn)] = &[
    ("torch.neg", |i| i.tensor(0).neg().into_outputs()),
    ("torch.abs", |i| i.tensor(0).abs().into_outputs()),
    ("torch.tanh", |i| i.tensor(0).tanh().into_outputs()),
    ("torch.exp", |i| i.tensor(0).exp().into_outputs()),
    ("fault_ref.identity", |i| i.tensor(0).clone().into_outputs()),
];

fn layer(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default())
        .cases(24)
        .mode(Mode::Live)
}

#[test]
fn sixteen_threads_of_checks_get_their_own_answers() {
    let threads: Vec<_> = (0..16)
        .map(|t| {
            std::thread::spawn(move || {
                for k in 0..3 {
                    let (reference, port) = PAIRS[(t + k) % PAIRS.len()];
                    let layer = layer(&format!("thread{t}_{k}"), reference);
                    if let Err(f) = golden::check(&layer, &port) {
                        panic!("thread {t}, check {k} ({reference}):\n{f}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a checking thread panicked");
    }
}

#[test]
fn a_worker_that_dies_does_not_disturb_the_checks_beside_it() {
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let failures = Arc::clone(&failures);
            std::thread::spawn(move || {
                if t % 4 == 0 {
                    let layer = layer(&format!("dies{t}"), "fault_ref.exits");
                    let port = |i: &PortInputs| i.tensor(0).clone().into_outputs();
                    let f = golden::check(&layer, &port).expect_err("a worker that exits fails");
                    assert!(f.to_string().contains("died with exit code 3"), "{f}");
                    failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                } else {
                    let (reference, port) = PAIRS[t % PAIRS.len()];
                    golden::check(&layer(&format!("beside{t}"), reference), &port)
                        .unwrap_or_else(|f| panic!("{f}"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a checking thread panicked");
    }
    assert_eq!(failures.load(std::sync::atomic::Ordering::SeqCst), 2);
}
