//! A failing check leaves its case behind, and `repro.py` reproduces it outside the test: it runs
//! the reference again and prints the same numbers as the test's message.

mod common;

use candle_core::{DType, Module};
use common::Scratch;
use golden::internal::describe::env::Mode;
use golden::{Dist, Failure, IntoOutputs, Layer, PortInputs};
use std::path::PathBuf;
use std::process::Command;

fn fail(layer: &Layer, port: &golden::Port<'_>) -> Failure {
    golden::check(&layer.clone().mode(Mode::Live), port).expect_err("a wrong port")
}

/// The folder named on the message's last line.
fn folder(failure: &Failure) -> PathBuf {
    let msg = failure.to_string();
    let last = msg.lines().last().unwrap().trim();
    let dir = PathBuf::from(last);
    assert!(
        dir.join("case.json").is_file(),
        "the last line is the artifacts' folder: {msg}"
    );
    dir
}

fn run_repro(dir: &std::path::Path) -> String {
    let out = Command::new(&golden::internal::describe::env::python().program)
        .arg(dir.join("repro.py"))
        .output()
        .expect("the interpreter runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The lines that carry numbers, from the test's message and from repro.py.
fn number_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("greatest ") || l.starts_with("NaN:"))
        .map(str::to_string)
        .collect()
}

#[test]
fn repro_prints_the_same_numbers_as_the_test() {
    let scratch = Scratch::new("artifacts_f32");
    let layer = Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(scratch.declared);
    let failure = fail(&layer, &|i| i.tensor(0).gelu().into_outputs());
    let dir = folder(&failure);
    for file in [
        "repro.py",
        "inputs/x.npy",
        "reference/out.npy",
        "port/out.npy",
        "rounding/out.npy",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    let msg = failure.to_string();
    assert!(
        msg.contains("re-run exactly this case: GOLDEN_CASE='"),
        "{msg}"
    );
    let repro = run_repro(&dir);
    assert!(
        repro.contains("reference run again gives exactly what the test saw"),
        "{repro}"
    );
    let expected = number_lines(&msg);
    assert_eq!(expected.len(), 3, "{msg}");
    assert_eq!(number_lines(&repro), expected, "{repro}");
}

#[test]
fn bf16_cases_round_trip_through_float32_copies() {
    let scratch = Scratch::new("artifacts_bf16");
    let layer = Layer::function("silu", "zoo_ref.silu")
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default())
        .dtypes(&[DType::BF16])
        .declared_at(scratch.declared);
    // A scale bug: silu(x) * 2.
    let failure = fail(&layer, &|i| {
        (candle_nn::ops::silu(i.tensor(0)).and_then(|y| y * 2.0)).into_outputs()
    });
    let msg = failure.to_string();
    let repro = run_repro(&folder(&failure));
    assert!(repro.contains("gives exactly what the test saw"), "{repro}");
    assert_eq!(number_lines(&repro), number_lines(&msg), "{repro}\n{msg}");
}

#[test]
fn module_form_artifacts_carry_the_state_dict() {
    let scratch = Scratch::new("artifacts_module");
    let layer = Layer::module("linear", "torch.nn.Linear")
        .init("in_features", 8usize)
        .init("out_features", 4usize)
        .dim("b", 1, 3)
        .arg("x", ["b".into(), golden::DimExpr::Lit(8)], Dist::default())
        .declared_at(scratch.declared);
    let no_bias = |i: &PortInputs| {
        candle_nn::linear_no_bias(8, 4, i.var_builder())
            .and_then(|l| l.forward(i.tensor(0)))
            .into_outputs()
    };
    let failure = fail(&layer, &no_bias);
    let dir = folder(&failure);
    assert!(
        dir.join("state_dict/weight.npy").is_file() && dir.join("state_dict/bias.npy").is_file()
    );
    let repro = run_repro(&dir);
    assert!(repro.contains("gives exactly what the test saw"), "{repro}");
    assert_eq!(
        number_lines(&repro),
        number_lines(&failure.to_string()),
        "{repro}"
    );
}

#[test]
fn a_gradient_failure_leaves_its_cotangents_and_a_repro_py_that_prints_the_same_numbers() {
    let scratch = Scratch::new("artifacts_gradients");
    let layer = Layer::function("square_half_gradient", "torch.square")
        .dim("b", 1, 4)
        .dim("n", 1, 32)
        .arg("x", ["b", "n"], Dist::default())
        .grad(golden::GradSpec::default())
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    // x · detach(x): the right square, half its gradient.
    let port = |i: &PortInputs| (i.tensor(0).detach() * i.tensor(0)).into_outputs();
    let failure =
        golden::internal::run::gradients::check(&layer, &port).expect_err("a wrong gradient");
    let msg = failure.to_string();
    let dir = folder(&failure);
    for file in [
        "repro.py",
        "inputs/x.npy",
        "cotangents/out.npy",
        "reference/grad.x.npy",
        "port/grad.x.npy",
        "rounding/grad.x.npy",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert!(
        msg.contains("and a repro.py that runs PyTorch's gradient again"),
        "{msg}"
    );
    let repro = run_repro(&dir);
    assert!(
        repro.starts_with(
            "golden repro: the gradients of `square_half_gradient` against PyTorch's of \
             `torch.square` in f32"
        ),
        "{repro}"
    );
    assert!(
        repro.contains(
            "leaf `grad.x` (f32 [1, 1]): reference run again gives exactly what the test saw"
        ),
        "{repro}"
    );
    let expected = number_lines(&msg);
    assert_eq!(expected.len(), 3, "{msg}");
    assert_eq!(number_lines(&repro), expected, "{repro}\n{msg}");
}
