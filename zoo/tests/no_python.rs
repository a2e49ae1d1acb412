//! With no Python at all: live fails and names the fix, auto replays the committed store, and says
//! so. A test binary of its own, because it points `GOLDEN_PYTHON` at nothing for the whole process
//! (every test here sets the same value).

mod common;

use golden::internal::describe::env::Mode;
use golden::{Dist, FailureKind, IntoOutputs, Layer, PortInputs};

fn no_python() {
    std::env::set_var("GOLDEN_PYTHON", "/nonexistent/bin/python3");
}

/// The zoo's `gelu`, named as the zoo names it so that it finds the zoo's committed store; its
/// regression file goes to a scratch folder.
fn zoo_gelu(scratch: &common::Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 256)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(golden::Declared {
            module_path: "golden_zoo::activations::gelu",
            snapshot_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"),
            ..scratch.declared
        })
}

fn gelu_erf(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu_erf().into_outputs()
}

#[test]
fn live_without_an_interpreter_names_the_fix() {
    no_python();
    let scratch = common::Scratch::new("no_python_live");
    let failure =
        golden::check(&zoo_gelu(&scratch).mode(Mode::Live), &gelu_erf).expect_err("no interpreter");
    assert!(matches!(failure.kind, FailureKind::Setup(_)), "{failure:?}");
    let msg = failure.to_string();
    assert!(
        msg.contains("could not start the Python interpreter `/nonexistent/bin/python3` (chosen from GOLDEN_PYTHON)"),
        "{msg}"
    );
    assert!(
        msg.contains("fix: run `golden setup` in your crate"),
        "{msg}"
    );
}

#[test]
fn auto_replays_the_committed_store_and_says_so() {
    no_python();
    let scratch = common::Scratch::new("no_python_auto");
    let report = golden::check(&zoo_gelu(&scratch).mode(Mode::Auto), &gelu_erf)
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(
        report.source.starts_with("replay (") && report.source.contains("activations__gelu.golden"),
        "{}",
        report.source
    );
    // The same snapshot as the live zoo's.
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/snapshots/activations__gelu.snap"
    ))
    .unwrap();
    assert!(
        committed.ends_with(&report.snapshot().unwrap()),
        "{committed}"
    );
}

#[test]
fn a_wrong_port_fails_in_replay_too() {
    no_python();
    let scratch = common::Scratch::new("no_python_wrong");
    let tanh = |i: &PortInputs| i.tensor(0).gelu().into_outputs();
    let msg = golden::check(&zoo_gelu(&scratch).mode(Mode::Replay), &tanh)
        .expect_err("wrong port")
        .to_string();
    assert!(
        msg.contains("does not match its reference `zoo_ref.gelu`"),
        "{msg}"
    );
    // The mutation diagnosis needs Python: it says it was skipped, and why, and starts nothing.
    assert!(
        msg.contains(
            "note: the mutation diagnosis was skipped: this is a replay and the interpreter \
             (/nonexistent/bin/python3, from GOLDEN_PYTHON) shows no torch"
        ),
        "{msg}"
    );
}

#[test]
fn auto_without_a_store_fails_with_both_reasons() {
    no_python();
    let layer =
        Layer::function("gelu", "zoo_ref.gelu")
            .dim("n", 1, 8)
            .arg("x", ["n"], Dist::default());
    let msg = golden::check(&layer.mode(Mode::Auto), &gelu_erf)
        .expect_err("nothing to run against")
        .to_string();
    assert!(
        msg.contains("could not start the Python interpreter"),
        "{msg}"
    );
    assert!(msg.contains("no replay either"), "{msg}");
}
