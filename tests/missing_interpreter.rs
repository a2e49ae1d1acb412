//! With no usable interpreter, a check fails before any case and says how to get one. A test binary
//! of its own: it sets `GOLDEN_PYTHON`, which every check in the process reads.

use golden::{Dist, FailureKind, IntoOutputs, Layer, PortInputs};

#[test]
fn a_missing_interpreter_is_named_with_the_fix() {
    std::env::set_var("GOLDEN_PYTHON", "/nonexistent/bin/python3");
    let layer =
        Layer::function("gelu", "zoo_ref.gelu")
            .dim("n", 1, 8)
            .arg("x", ["n"], Dist::default());
    let port = |i: &PortInputs| i.tensor(0).gelu_erf().into_outputs();
    let failure = golden::check(&layer, &port).expect_err("no interpreter, no pass");
    assert!(matches!(failure.kind, FailureKind::Setup(_)), "{failure:?}");
    let msg = failure.to_string();
    assert!(
        msg.contains("could not start the Python interpreter `/nonexistent/bin/python3` (chosen from GOLDEN_PYTHON)"),
        "{msg}"
    );
    assert!(msg.contains("cargo xtask setup"), "{msg}");
}
