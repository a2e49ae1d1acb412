//! A reference that cannot be reached or misbehaves must end in a message that names the fix,
//! never a pass, a hang or a panic in a worker thread. The faulty references are in
//! `reference_py/fault_ref`.

mod common;

use candle_core::{DType, Result, Tensor};
use common::{must_fail, must_pass};
use golden::{Dist, Failure, FailureKind, IntoOutputs, Layer, PortInputs};
use std::collections::BTreeMap;

fn layer(reference: &str) -> Layer {
    Layer::function("port", reference)
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(8)
}

fn identity(i: &PortInputs) -> std::result::Result<golden::Outputs, String> {
    i.tensor(0).clone().into_outputs()
}

fn failure(layer: &Layer, port: &golden::Port<'_>) -> Failure {
    match golden::check(layer, port) {
        Ok(_) => panic!("`{}` passed", layer.reference()),
        Err(f) => f,
    }
}

#[test]
fn a_module_that_fails_to_import_shows_the_import_error() {
    let f = failure(&layer("fault_ref.broken_import.fn"), &identity);
    assert!(matches!(f.kind, FailureKind::Setup(_)), "{f:?}");
    let msg = f.to_string();
    assert!(
        msg.contains("could not reach its reference `fault_ref.broken_import.fn`"),
        "{msg}"
    );
    assert!(
        msg.contains("ModuleNotFoundError: No module named 'a_dependency_that_is_not_installed'"),
        "{msg}"
    );
    assert!(
        msg.contains("Python traceback:") && msg.contains("broken_import.py"),
        "{msg}"
    );
    assert!(
        !msg.contains("importlib"),
        "importlib's frames are left out: {msg}"
    );
    // The interpreter golden used, and the commands that add the missing package to it.
    let python = golden::internal::describe::env::python()
        .program
        .display()
        .to_string();
    assert!(
        msg.contains(&format!(
            "fix: the interpreter golden used, `{python}` (chosen from {}), has no module \
             `a_dependency_that_is_not_installed`. Add `a_dependency_that_is_not_installed` to \
             reference_py/requirements.txt beside your Cargo.toml and run `golden setup`, or \
             install it into that interpreter: {python} -m pip install \
             a_dependency_that_is_not_installed",
            golden::internal::describe::env::python().source
        )),
        "{msg}"
    );
}

#[test]
fn a_package_that_does_not_exist_names_the_import_roots() {
    let msg = failure(&layer("no_such_package.layers.gelu"), &identity).to_string();
    assert!(msg.contains("no module named `no_such_package`"), "{msg}");
    assert!(
        msg.contains("reference_py"),
        "the roots searched are listed: {msg}"
    );
    assert!(msg.contains("GOLDEN_REFERENCE_PATH"), "{msg}");
    let python = golden::internal::describe::env::python()
        .program
        .display()
        .to_string();
    assert!(
        msg.contains("or the site-packages of `"),
        "the interpreter whose packages were searched: {msg}"
    );
    assert!(
        msg.contains(&format!(
            "if it is a package from PyPI, add it to reference_py/requirements.txt and run \
             `golden setup`, or install it into the interpreter golden used: {python} -m pip \
             install no_such_package"
        )),
        "{msg}"
    );
}

#[test]
fn a_misspelt_callable_suggests_the_right_one() {
    let msg = failure(&layer("zoo_ref.gleu"), &identity).to_string();
    assert!(
        msg.contains("`zoo_ref` has no attribute `gleu`; did you mean `zoo_ref.gelu`?"),
        "{msg}"
    );
}

#[test]
fn a_value_that_is_not_callable_is_refused() {
    let msg = failure(&layer("fault_ref.NOT_CALLABLE"), &identity).to_string();
    assert!(
        msg.contains("`fault_ref.NOT_CALLABLE` is a int, not a callable"),
        "{msg}"
    );
}

#[test]
fn a_reference_that_raises_shows_its_traceback_and_the_smallest_case() {
    let f = failure(&layer("fault_ref.raises"), &identity);
    let msg = f.to_string();
    assert!(
        msg.contains("its reference `fault_ref.raises` failed on a generated case in f32"),
        "{msg}"
    );
    assert!(
        !msg.contains("golden_ref"),
        "golden's own frames are left out: {msg}"
    );
    assert!(
        msg.contains("ValueError: refusing a last dim of 3"),
        "{msg}"
    );
    assert!(
        msg.contains("Traceback") && msg.contains("fault_ref/__init__.py"),
        "{msg}"
    );
    // The reference raises from n = 3 on: shrinking finds exactly that boundary.
    assert_eq!(f.case.unwrap().dims, [("n".to_string(), 3)]);
}

#[test]
fn a_python_float_is_not_a_tensor() {
    let msg = failure(&layer("fault_ref.returns_float"), &identity).to_string();
    assert!(msg.contains("`out` is a builtins.float"), "{msg}");
    assert!(msg.contains("where a torch tensor was expected"), "{msg}");
    assert!(
        msg.contains("return a tensor, a tuple/list of tensors, or a dict of tensors"),
        "{msg}"
    );
}

#[test]
fn none_is_not_a_tensor() {
    let msg = failure(&layer("fault_ref.returns_none"), &identity).to_string();
    assert!(
        msg.contains("`out` is None where a tensor was expected"),
        "{msg}"
    );
}

#[test]
fn a_string_inside_a_list_is_named_by_its_position() {
    let msg = failure(&layer("fault_ref.returns_list_of_str"), &identity).to_string();
    assert!(msg.contains("`out.1` is a builtins.str"), "{msg}");
}

#[test]
fn a_reference_returning_two_outputs_against_a_port_returning_one() {
    let msg = failure(&layer("fault_ref.returns_pair"), &identity).to_string();
    assert!(
        msg.contains("leaf `out.0` (f32 [4]): the reference returns it, the port does not"),
        "{msg}"
    );
    assert!(
        msg.contains("leaf `out.1` (f32 [4]): the reference returns it, the port does not"),
        "{msg}"
    );
    assert!(
        msg.contains("leaf `out` (f32 [4]): the port returns it, the reference does not"),
        "{msg}"
    );
}

#[test]
fn a_tuple_port_matches_a_tuple_reference() {
    let port = |i: &PortInputs| -> std::result::Result<golden::Outputs, String> {
        let x = i.tensor(0);
        (|| -> Result<(Tensor, Tensor)> { Ok((x.clone(), (x * 2.0)?)) })().into_outputs()
    };
    golden::check(&layer("fault_ref.returns_pair"), &port).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn dict_outputs_are_compared_by_key() {
    let port = |i: &PortInputs| -> std::result::Result<golden::Outputs, String> {
        let x = i.tensor(0);
        (|| -> Result<BTreeMap<&str, Tensor>> {
            Ok(BTreeMap::from([
                ("double", (x * 2.0)?),
                ("half", (x / 2.0)?),
            ]))
        })()
        .into_outputs()
    };
    golden::check(&layer("fault_ref.returns_dict"), &port).unwrap_or_else(|f| panic!("{f}"));
    // And a wrong key is named.
    let wrong = |i: &PortInputs| -> std::result::Result<golden::Outputs, String> {
        let x = i.tensor(0);
        (|| -> Result<BTreeMap<&str, Tensor>> {
            Ok(BTreeMap::from([
                ("double", (x * 2.0)?),
                ("halved", (x / 2.0)?),
            ]))
        })()
        .into_outputs()
    };
    let msg = failure(&layer("fault_ref.returns_dict"), &wrong).to_string();
    assert!(
        msg.contains("leaf `out.half`") && msg.contains("leaf `out.halved`"),
        "{msg}"
    );
}

#[test]
fn an_output_in_another_float_dtype_says_to_convert_it() {
    let msg = failure(&layer("fault_ref.two_outputs_wrong_dtype"), &identity).to_string();
    assert!(
        msg.contains("the port returns f32 [1], the reference f64 [1] — convert the output"),
        "{msg}"
    );
}

#[test]
fn a_function_used_in_module_form_is_refused() {
    let layer =
        Layer::module("port", "zoo_ref.gelu")
            .dim("n", 1, 8)
            .arg("x", ["n"], Dist::default());
    let msg = failure(&layer, &identity).to_string();
    assert!(
        msg.contains("must be an nn.Module class; it is a function"),
        "{msg}"
    );
}

#[test]
fn the_numpy_backend_runs_numpy_references() {
    // numpy.tanh is itself the reference: it receives an ndarray and returns one.
    let layer = Layer::function("tanh", "numpy.tanh")
        .backend(golden::Backend::Numpy)
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default())
        .dtypes(&[DType::F32, DType::F64]);
    let port = |i: &PortInputs| i.tensor(0).tanh().into_outputs();
    golden::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_scalar_output_keeps_its_empty_shape() {
    // torch.sum returns a 0-d tensor; so does candle's sum_all.
    let port = |i: &PortInputs| i.tensor(0).sum_all().into_outputs();
    let report = golden::check(&layer("torch.sum"), &port).unwrap_or_else(|f| panic!("{f}"));
    let leaf = &report.runs[0].cases[0].leaves[0];
    assert_eq!(leaf.reference.as_ref().unwrap().0, Vec::<usize>::new());
}

/// Unseeded `np.random`/`random` noise once passed for rounding error (the float32 and float64
/// evaluations drew different noise, which widened the tolerance, #7 item 4). The reference is
/// evaluated twice on the first case and on every failing one; it takes the live reference, a
/// store holding one answer per case.
#[test]
fn unseeded_noise_is_reported_as_a_nondeterministic_reference() {
    for reference in ["verdict_ref.noisy_numpy", "verdict_ref.noisy_random"] {
        let layer = Layer::function("noisy", reference)
            .dim("b", 1, 3)
            .dim("n", 1, 16)
            .arg("x", ["b", "n"], Dist::default())
            .mode(golden::internal::describe::env::Mode::Live);
        let msg = failure(&layer, &identity).to_string();
        assert!(
            msg.contains(&format!(
                "golden: `noisy`: its reference `{reference}` is not deterministic"
            )),
            "{msg}"
        );
        assert!(
            msg.contains("differs between") && msg.contains("on the same inputs"),
            "{msg}"
        );
        assert!(msg.contains("np.random or random"), "{msg}");
    }
}

/// `decode(...)` on a transformers module that keeps no cache: no case can run (a reference of
/// `tests/schedules.rs`'s kind, here because it needs the live reference to say so).
#[test]
fn a_reference_without_a_cache_is_a_clear_error_not_a_shrunk_case() {
    let layer = Layer::module(
        "s_mlp_no_cache",
        "transformers.models.llama.modeling_llama.LlamaMLP",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", 8usize)
    .config_value("intermediate_size", 12usize)
    .config_value("num_attention_heads", 2usize)
    .dim("n", 2, 6)
    .arg(
        "x",
        [golden::DimExpr::Lit(1), "n".into(), golden::DimExpr::Lit(8)],
        golden::Dist::default(),
    )
    .decode(golden::Decode::over("x"));
    let port = |inputs: &golden::PortInputs| {
        golden::drive(inputs, |_| {
            golden::IntoStepper::into_stepper(Ok::<_, String>(|step: &golden::Step| {
                Ok::<_, candle_core::Error>(step.tensor(0).clone())
            }))
        })
    };
    let msg = golden::check(&layer, &port)
        .expect_err("no cache")
        .to_string();
    assert!(
        msg.contains(
            "cannot check `s_mlp_no_cache`: the reference cannot be driven through \
                      `decode`'s schedules"
        ) && msg.contains("`LlamaMLP.forward` takes no `past_key_values`"),
        "{msg}"
    );
    assert!(!msg.contains("shrunk"), "{msg}");
}

/// A crate whose path holds `:` cannot put its `reference_py` in PYTHONPATH (`:` separates its
/// entries); the check failed with "could not start the Python interpreter ... run `golden
/// setup`", a fix that changes nothing (#21 item 14). golden reaches such a root through a link of
/// its own in the target folder instead, so the check runs.
#[test]
fn a_crate_whose_path_holds_a_colon_runs_its_references() {
    let dir = std::env::temp_dir().join(format!("golden-colon:crate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("reference_py")).unwrap();
    std::fs::write(
        dir.join("reference_py/colon_ref.py"),
        "def double(x):\n    return x * 2\n",
    )
    .unwrap();
    let leak = |p: std::path::PathBuf| -> &'static str {
        Box::leak(p.display().to_string().into_boxed_str())
    };
    let declared = golden::Declared {
        source_file: leak(dir.join("check.rs")),
        module_path: "colon::double",
        manifest_dir: leak(dir.clone()),
        package: "colon",
        snapshot_dir: leak(dir.join("snapshots")),
    };
    let layer = Layer::function("double", "colon_ref.double")
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .declared_at(declared)
        .mode(golden::internal::describe::env::Mode::Live);
    let port = |i: &PortInputs| (i.tensor(0) * 2.0).into_outputs();
    let result = golden::check(&layer, &port);
    std::fs::remove_dir_all(&dir).unwrap();
    result.unwrap_or_else(|f| panic!("{f}"));
}

/// A reference that returns a persistent buffer of its own, writing unseeded noise into it at every
/// call: the answer golden kept was that buffer, which the next evaluations overwrote — so two
/// evaluations "agreed" and the noise was misexplained as "not the same computation" (#21 item
/// 14). The answer is copied before the reference runs again.
#[test]
fn noise_in_a_buffer_the_reference_returns_is_reported_as_nondeterministic() {
    let reference = "verdict_ref.noise_into_a_buffer";
    let layer = Layer::function("noisy_buffer", reference)
        .dim("b", 1, 3)
        .dim("n", 1, 16)
        .arg("x", ["b", "n"], Dist::default())
        .mode(golden::internal::describe::env::Mode::Live);
    let msg = failure(&layer, &identity).to_string();
    assert!(
        msg.contains(&format!(
            "golden: `noisy_buffer`: its reference `{reference}` is not deterministic"
        )),
        "{msg}"
    );
    assert!(!msg.contains("not the same computation"), "{msg}");
}

// --- Verdicts that only the live reference can show (a store holds one answer per case, the
// answer of a reference that drifts, branches on golden's float64 pass or overflows as it did when
// recorded): `tests/verdicts.rs` holds the others, replayed in CI.

fn vector(name: &str, reference: &str) -> Layer {
    Layer::function(name, reference)
        .dim("b", 1, 3)
        .dim("n", 1, 16)
        .arg("x", ["b", "n"], Dist::default())
}

/// Only the first case of each dtype was evaluated twice. A reference exact for two calls and then
/// off by 0.25 more per call (a counter, a cache, an accumulating buffer) passed a port off by 10 on
/// 8 of 8 cases: the nudged evaluations "moved" by the drift, which was taken for rounding (#21
/// item 2); so did unseeded noise that begins after the second call. Every case's answer is now
/// proven deterministic: its first evaluation in each precision is repeated after the others.
#[test]
fn drift_that_starts_after_the_second_call_is_not_rounding() {
    for reference in [
        "verdict_ref.drifts_after_two_calls",
        "verdict_ref.noisy_after_two_calls",
    ] {
        let layer = vector("v_drift", reference)
            .cases(8)
            .mode(golden::internal::describe::env::Mode::Live);
        let msg = must_fail(&layer, |i| i.tensor(0) + 10.0).to_string();
        assert!(
            msg.contains(&format!("its reference `{reference}` is not deterministic")),
            "{reference}: {msg}"
        );
    }
}

/// A reference that takes another branch in golden's float64 pass (here: tanh GELU whenever a
/// TorchFunctionMode is active) passed the wrong tanh port 8 of 8: any float64-only difference
/// below ~4096 ulps was taken as rounding (#21 item 3). A float64 answer that differs from the
/// case-dtype answer by the same amount at every nudged input — far more than the nudges move
/// it — is not rounding, and widens nothing.
#[test]
fn a_reference_that_computes_otherwise_in_float64_widens_nothing() {
    let layer = |name| {
        vector(name, "verdict_ref.gelu_tanh_when_watched")
            .cases(8)
            .mode(golden::internal::describe::env::Mode::Live)
    };
    let msg = must_fail(&layer("v_f64_branch_tanh"), |i| i.tensor(0).gelu()).to_string();
    assert!(msg.contains("leaf `out`"), "{msg}");
    assert!(
        msg.contains("the reference in float64 is not the same computation"),
        "{msg}"
    );
    must_pass(&layer("v_f64_branch_right"), |i| i.tensor(0).gelu_erf());
}

/// A reference that gives NaN where its float64 run does not (an overflow in the case dtype) was
/// matched by any port that gives NaN there: NaN matched NaN. The check cannot judge the port at
/// such elements, and says so; it never takes them for agreement (#21 item 4).
#[test]
fn nan_that_only_the_case_dtype_gives_is_never_agreement() {
    let layer = vector("v_nan_overflow", "verdict_ref.nan_where_float64_is_not")
        .cases(4)
        .mode(golden::internal::describe::env::Mode::Live);
    let msg = must_fail(&layer, |i| i.tensor(0) * f64::NAN).to_string();
    assert!(msg.contains("golden cannot judge the port there"), "{msg}");
    assert!(msg.contains("the reference is NaN or ±Inf at"), "{msg}");
}
