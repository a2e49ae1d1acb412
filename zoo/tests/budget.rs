//! A time budget (`budget = "60s"`, `GOLDEN_BUDGET`): a check runs as many of its declared cases
//! as fit in it, at least one, says so in its snapshot, and its golden store keeps the count, so
//! that the runs after a recording (live beside the store, and replay) run the same cases and the
//! snapshot stays the same whatever the machine's speed.

mod common;

use common::Scratch;
use golden::internal::describe::env::Mode;
use golden::{Dist, Layer, Report};
use std::path::Path;

/// `fault_ref.takes_its_time`: the identity, each call sleeping the seconds written in `delay`.
fn layer(name: &str, delay: &Path, scratch: &Scratch) -> Layer {
    Layer::function(name, "fault_ref.takes_its_time")
        .dim("n", 1, 4)
        .arg("x", ["n"], Dist::default())
        .konst("delay_file", delay.to_str().unwrap())
        .cases(4)
        .budget(1.0)
        .declared_at(scratch.declared)
}

fn identity(inputs: &golden::PortInputs) -> Result<golden::Outputs, String> {
    use golden::IntoOutputs;
    Ok::<_, candle_core::Error>(inputs.tensor(0).clone()).into_outputs()
}

fn run(layer: &Layer, mode: Mode) -> Report {
    golden::check(&layer.clone().mode(mode), &identity).unwrap_or_else(|f| panic!("{f}"))
}

fn cases(report: &Report) -> usize {
    report.runs[0].cases.len()
}

#[test]
fn a_budget_runs_the_cases_that_fit_says_so_and_its_store_keeps_the_count() {
    let scratch = Scratch::new("b_budget");
    let delay = scratch.dir.join("delay");
    // Each call takes 0.3 s (a case is a dozen calls): a 1 s budget holds the first case only,
    // on any machine.
    std::fs::write(&delay, "0.3").unwrap();
    let layer = layer("b_budget", &delay, &scratch);
    let recorded = run(&layer, Mode::Record);
    assert_eq!(cases(&recorded), 1);
    let snapshot = recorded.snapshot().expect("every case ran");
    assert!(
        snapshot.contains("cases: up to 4 per dtype, as many as a 1 s budget holds, seed 0")
            && snapshot.contains(
                "  cases: 1 of at most 4, as many as the 1 s budget held (the golden store \
                 keeps the count)"
            ),
        "{snapshot}"
    );
    // The reference is fast now: beside the store, a live run keeps the recorded count (and the
    // snapshot), and so does a replay.
    std::fs::write(&delay, "0").unwrap();
    let live = run(&layer, Mode::Live);
    assert_eq!(cases(&live), 1);
    assert_eq!(live.snapshot(), Some(snapshot.clone()));
    let replayed = run(&layer, Mode::Replay);
    assert_eq!(cases(&replayed), 1);
    // Without a store the budget decides: four fast cases fit in ten minutes.
    std::fs::remove_file(scratch.store(&layer)).unwrap();
    let timed = run(&layer.clone().budget(600.0), Mode::Live);
    assert_eq!(cases(&timed), 4, "{:?}", timed.snapshot());
    // Recording again times the cases afresh, and the store keeps the new count.
    let again = run(&layer.clone().budget(600.0), Mode::Record);
    assert_eq!(cases(&again), 4);
    let replayed = run(&layer.clone().budget(600.0), Mode::Replay);
    assert_eq!(cases(&replayed), 4);
}
