//! The record → review → replay loop as the book tells it (docs/src/your-crate.md, docs/src/snapshots.md), and the saved failing cases a check
//! replays first:
//!
//! * `GOLDEN_MODE=record` brings the committed snapshot's store lines up to date with the store it
//!   wrote (it used to fail every check: the store's digest line changed, and insta refused), and
//!   leaves no stale `.snap.new`; the replay that follows passes with the same snapshot;
//! * a failing case saved by one check is replayed by that check only (proptest's file is per
//!   source file, and a seed draws another case in another check: an extra case, which a replay of
//!   its store does not hold); a saved case that fails again says it was a saved one;
//! * `GOLDEN_SEED` set explicitly runs that seed's cases, without the saved ones;
//! * a store that reaches its size bound (`GOLDEN_STORE_LIMIT`) is recorded partial, and the
//!   replay that follows still passes: its snapshot names it.
//!
//! The snapshots are asserted as the attribute's generated code asserts them (insta, golden's
//! comparator, the same hooks). A test binary of its own: one test sets `GOLDEN_SEED`.

mod common;

use common::Scratch;
use golden::internal::describe::env::Mode;
use golden::{Dist, IntoOutputs, Layer, PortInputs, Report};
use std::sync::Mutex;

/// `GOLDEN_SEED` is read by every check of the process: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn gelu(scratch: &Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .cases(8)
        .declared_at(scratch.declared)
}

fn silu(scratch: &Scratch) -> Layer {
    Layer::function("silu", "zoo_ref.silu")
        .dim("n", 1, 32)
        .arg("x", ["n"], Dist::default())
        .cases(8)
        .declared_at(scratch.declared)
}

fn gelu_erf(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu_erf().into_outputs()
}

fn gelu_tanh(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu().into_outputs()
}

fn silu_port(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).silu().into_outputs()
}

/// What `#[golden_layer]`'s generated `snapshot()` does with a passing check's report.
fn assert_snapshot(report: &Report) {
    let Some(text) = report.snapshot() else {
        golden::__private::skipped_snapshot(report);
        return;
    };
    if golden::__private::first_snapshot(report, &text) {
        return;
    }
    let mut settings = golden::__private::insta::Settings::clone_current();
    settings.set_snapshot_path(report.layer.declared().unwrap().snapshot_dir);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_comparator(Box::new(golden::__private::SnapshotComparator));
    settings.bind(|| {
        golden::__private::insta::assert_snapshot!(report.snapshot_name(), text);
    });
}

fn store_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("golden store: "))
        .collect()
}

#[test]
fn recording_leaves_a_snapshot_that_agrees_with_its_store_and_replay_passes() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("record_loop");
    // The first live run, before any store: its snapshot has no store lines (written here as the
    // first run writes it; with CI=true it would not be written at all).
    let live = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    let first = live.snapshot().unwrap();
    assert!(store_lines(&first).is_empty(), "{first}");
    let snap = live.snapshot_file().unwrap();
    std::fs::create_dir_all(snap.parent().unwrap()).unwrap();
    std::fs::write(&snap, format!("---\nsource: src/check.rs\n---\n{first}")).unwrap();
    // A pending snapshot from an earlier failed run, made against no store: stale once recorded.
    let pending = snap.with_extension("snap.new");
    std::fs::write(&pending, "---\nsource: src/check.rs\n---\nlayer: stale\n").unwrap();

    // `GOLDEN_MODE=record cargo test`: passes, and the snapshot names the store it wrote.
    let recorded = golden::check(&gelu(&scratch).mode(Mode::Record), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(recorded.recorded);
    assert_snapshot(&recorded);
    let after_record = std::fs::read_to_string(&snap).unwrap();
    let text = recorded.snapshot().unwrap();
    let wanted = store_lines(&text);
    assert_eq!(store_lines(&after_record), wanted, "{after_record}");
    assert!(
        wanted[0].starts_with("golden store: recorded with Python 3.")
            && wanted[0].contains("numpy ")
            && wanted
                .iter()
                .any(|l| l.starts_with("golden store: source zoo_ref/functional.py sha256 ")),
        "{wanted:?}"
    );
    assert!(!pending.exists(), "a stale .snap.new was left");
    // Everything but the store lines is as the first run wrote it.
    let without = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("golden store: "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        without(&after_record),
        without(&format!("---\nsource: src/check.rs\n---\n{first}"))
    );

    // `GOLDEN_MODE=replay cargo test` (CI): the same snapshot, nothing written.
    let replayed = golden::check(&gelu(&scratch).mode(Mode::Replay), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(!replayed.recorded);
    assert_snapshot(&replayed);
    assert_eq!(std::fs::read_to_string(&snap).unwrap(), after_record);
    assert!(!pending.exists());

    // Recording again with nothing changed changes nothing.
    let again = golden::check(&gelu(&scratch).mode(Mode::Record), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert_snapshot(&again);
    assert_eq!(std::fs::read_to_string(&snap).unwrap(), after_record);
}

#[test]
fn a_saved_failing_case_is_replayed_by_the_check_that_saved_it_only() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("saved_cases");
    // Two checks declared in one source file; `silu`'s store is recorded first.
    golden::check(&silu(&scratch).mode(Mode::Record), &silu_port).unwrap_or_else(|f| panic!("{f}"));
    // `gelu`'s wrong port fails, and its case is saved, tagged with the check's name.
    let failure = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_tanh).unwrap_err();
    assert!(
        !failure.to_string().contains("saved by an earlier failure"),
        "{failure}"
    );
    let file = scratch.dir.join("proptest-regressions/check.txt");
    let saved = std::fs::read_to_string(&file).unwrap();
    let line = saved.lines().find(|l| l.starts_with("cc ")).unwrap();
    let check = gelu(&scratch).check_name();
    assert!(
        line.contains(&format!(" # {check}: shrinks to CaseParams")),
        "{saved}"
    );
    // `silu` replays its store: no case of `gelu`'s is added to it (before, the saved seed drew
    // a case its store did not hold, and the replay failed as out of date).
    let replay = golden::check(&silu(&scratch).mode(Mode::Replay), &silu_port)
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(replay.runs[0].replayed.is_empty());
    assert_eq!(replay.runs[0].cases.len(), 8);
    // `gelu` replays its own saved case first; it fails again, and says it was the saved one.
    let again = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_tanh).unwrap_err();
    let msg = again.to_string();
    assert!(
        msg.contains("the first failing case was saved by an earlier failure of this check")
            && msg.contains(&file.display().to_string())
            && msg.contains("`GOLDEN_SEED=<n>` runs other cases without it"),
        "{msg}"
    );
    // A right port passes, the saved case among its cases, the snapshot describing the generated
    // ones only.
    let right = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(right.runs[0].replayed.len(), 1);
    assert_eq!(right.runs[0].cases.len(), 8);

    // An explicit GOLDEN_SEED runs its own cases: the saved one does not come first.
    std::env::set_var("GOLDEN_SEED", "7");
    let seeded = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_erf);
    let seeded_failure = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_tanh);
    std::env::remove_var("GOLDEN_SEED");
    let seeded = seeded.unwrap_or_else(|f| panic!("{f}"));
    assert!(seeded.runs[0].replayed.is_empty());
    assert_eq!(seeded.seed, 7);
    let seeded_failure = seeded_failure.unwrap_err().to_string();
    assert!(
        !seeded_failure.contains("saved by an earlier failure"),
        "{seeded_failure}"
    );
}

/// #31 item 17: `GOLDEN_MODE=record` then replay failed out of the box when the store reached its
/// size bound. Record ran the recorded cases only, so the snapshot (which describes every declared
/// case) was skipped and its store lines kept naming the old store; the replay of the partial store,
/// which checks its SHA-256 against the snapshot's, then failed ("the store changed without its
/// snapshot"), and record's warning was hidden by cargo's capture of passing tests. Record now runs
/// every declared case against the live reference (storing those that fit), so its snapshot is
/// asserted and its store lines name the partial store it wrote, which they say is partial.
#[test]
fn recording_a_store_beyond_its_bound_leaves_a_snapshot_that_vouches_for_it() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("record_partial");
    // The first live run writes the snapshot (as it does outside CI).
    let live = golden::check(&gelu(&scratch).mode(Mode::Live), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert_snapshot(&live);
    let snap = live.snapshot_file().unwrap();
    assert!(snap.exists());

    // `GOLDEN_STORE_LIMIT=0.004 GOLDEN_MODE=record cargo test`: 4 KiB hold some of the 8 cases.
    std::env::set_var("GOLDEN_STORE_LIMIT", "0.004");
    let recorded = golden::check(&gelu(&scratch).mode(Mode::Record), &gelu_erf);
    std::env::remove_var("GOLDEN_STORE_LIMIT");
    let recorded = recorded.unwrap_or_else(|f| panic!("{f}"));
    let store = golden::internal::answers::store::Store::load(&scratch.store(&gelu(&scratch)))
        .unwrap()
        .expect("recorded");
    let (kept, _) = store.partial.expect("the bound dropped cases");
    assert!(kept > 0 && kept < 8, "{kept}");
    assert_snapshot(&recorded);
    let text = std::fs::read_to_string(&snap).unwrap();
    assert!(
        text.contains(&format!(
            "golden store: partial: holds {kept} of the 8 cases recording evaluated, the others \
             beyond its size bound"
        )),
        "{text}"
    );

    // `GOLDEN_MODE=replay cargo test` (CI): passes on the recorded cases, the snapshot untouched.
    let replayed = golden::check(&gelu(&scratch).mode(Mode::Replay), &gelu_erf)
        .unwrap_or_else(|f| panic!("the replay after recording failed:\n{f}"));
    assert_eq!(replayed.runs[0].cases.len(), kept);
    assert_snapshot(&replayed);
    assert_eq!(std::fs::read_to_string(&snap).unwrap(), text);
}
