//! Deliberately wrong ports of zoo layers: golden must catch each one, on a small case, with a
//! message that says what is wrong. They go through the public API (the same `golden::check` the
//! attribute's generated test calls), because a `#[golden_layer]` test of a wrong port would fail by
//! design.
//!
//! Each has a golden store in `tests/golden/`, recorded with the wrong port
//! (`GOLDEN_MODE=record cargo test --test wrong_ports`), so every assertion here holds in replay too,
//! with no Python: CI runs this file both ways.

mod common;

use candle_core::{Module, D};
use golden::internal::judge::compare::Verdict;
use golden::{Dist, Failure, Layer};

use common::must_fail;

fn named(layer: Layer, name: &str) -> Layer {
    layer.named(name)
}

fn dims(failure: &Failure) -> Vec<(String, usize)> {
    failure.case.as_ref().expect("a failing case").dims.clone()
}

fn gelu_layer() -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 256)
        .arg("x", ["b", "n"], Dist::default())
}

#[test]
fn gelu_tanh_checked_against_erf_reports_the_greatest_difference() {
    let failure = must_fail(&gelu_layer(), |i| i.tensor(0).gelu());
    let msg = failure.to_string();
    assert!(
        msg.contains("golden: `gelu` does not match its reference `zoo_ref.gelu` in f32"),
        "{msg}"
    );
    assert!(
        msg.contains("leaf `out`") && msg.contains("greatest absolute difference"),
        "{msg}"
    );
    assert!(
        msg.contains("allowed") && msg.contains("tolerance:"),
        "{msg}"
    );
    // Shrunk to a single element.
    assert_eq!(dims(&failure), [("b".to_string(), 1), ("n".to_string(), 1)]);
    // |gelu_erf − gelu_tanh| peaks at 4.73e-4 (x ≈ 2.70); whatever element was found, the reported
    // difference is that function's, far above float32 noise.
    let leaf = &failure.case_failure().unwrap().leaves[0];
    let Verdict::Values(v) = &leaf.verdict else {
        panic!("{leaf:?}")
    };
    let g = v.greatest_abs.as_ref().unwrap();
    assert!(g.diff > 1e-5 && g.diff <= 4.74e-4, "{g:?}");
    assert!(g.diff > 5.0 * g.allowed, "{g:?}");
}

fn linear_module(name: &str) -> Layer {
    Layer::module(name, "torch.nn.Linear")
        .init("in_features", 16usize)
        .init("out_features", 8usize)
        .dim("b", 1, 4)
        .arg("x", ["b".into(), golden::DimExpr::Lit(16)], Dist::default())
}

#[test]
fn a_linear_that_forgets_its_bias_leaves_bias_unused() {
    let failure = must_fail(&linear_module("linear_forgotten_bias"), |i| {
        candle_nn::linear_no_bias(16, 8, i.var_builder())?.forward(i.tensor(0))
    });
    let msg = failure.to_string();
    assert!(
        msg.contains("the reference's state_dict has `bias` [8], which the port never reads"),
        "{msg}"
    );
    assert!(msg.contains("a forgotten bias?"), "{msg}");
}

#[test]
fn a_transposed_weight_names_both_shapes() {
    let failure = must_fail(&linear_module("linear_transposed_weight"), |i| {
        let vb = i.var_builder();
        let weight = vb.get((16, 8), "weight")?;
        let bias = vb.get(8, "bias")?;
        i.tensor(0).matmul(&weight)?.broadcast_add(&bias)
    });
    let msg = failure.to_string();
    assert!(
        msg.contains("the port asks for `weight` with shape [16, 8]; the reference's is [8, 16]"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "transposed: PyTorch's nn.Linear stores weight as [out_features, in_features]"
        ),
        "{msg}"
    );
}

#[test]
fn a_port_asking_for_a_weight_the_module_lacks_is_told_what_exists() {
    let failure = must_fail(&linear_module("linear_unknown_name"), |i| {
        let vb = i.var_builder();
        let w = vb.get((8, 16), "kernel")?;
        i.tensor(0).matmul(&w.t()?)
    });
    let msg = failure.to_string();
    assert!(msg.contains("the port asks for `kernel` [8, 16], which the reference module does not have (it has: weight, bias)"), "{msg}");
}

#[test]
fn softmax_over_the_wrong_dim_is_caught_on_a_tiny_case() {
    let layer = Layer::function("softmax", "zoo_ref.softmax")
        .dim("b", 1, 4)
        .dim("t", 1, 16)
        .dim("n", 1, 128)
        .arg("x", ["b", "t", "n"], Dist::default());
    let failure = must_fail(&layer, |i| candle_nn::ops::softmax(i.tensor(0), 1));
    let msg = failure.to_string();
    assert!(
        msg.contains("leaf `out`") && msg.contains("elements differ"),
        "{msg}"
    );
    // The smallest case that tells the two dims apart: one row of two.
    assert_eq!(
        dims(&failure),
        [
            ("b".to_string(), 1),
            ("t".to_string(), 1),
            ("n".to_string(), 2)
        ]
    );
}

#[test]
fn layer_norm_with_eps_1e3_instead_of_1e5_is_caught() {
    let layer = Layer::function("layer_norm", "zoo_ref.layer_norm")
        .dim("b", 1, 4)
        .dim("t", 1, 16)
        .dim("d", 1, 64)
        .arg("x", ["b", "t", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1))
        .arg("bias", ["d"], Dist::normal(0.0, 0.1))
        .konst("eps", 1e-5);
    let failure = must_fail(&layer, |i| {
        let x = i.tensor(0);
        let centered = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&(var + 1e-3)?.sqrt()?)?;
        normed
            .broadcast_mul(i.tensor(1))?
            .broadcast_add(i.tensor(2))
    });
    let msg = failure.to_string();
    assert!(
        msg.contains("does not match its reference `zoo_ref.layer_norm`"),
        "{msg}"
    );
    let leaf = &failure.case_failure().unwrap().leaves[0];
    let Verdict::Values(v) = &leaf.verdict else {
        panic!("{leaf:?}")
    };
    // An eps 100x too large is not a rounding matter: even on the smallest failing case the
    // difference is hundreds of times what float32 rounding explains there.
    assert!(v.mismatched > 0 && v.factor_needed > 100.0, "{v:?}");
}

#[test]
fn a_port_that_returns_an_error_is_reported_with_it() {
    let failure = must_fail(&named(gelu_layer(), "gelu_port_error"), |i| {
        i.tensor(0).reshape((7, 7))
    });
    let msg = failure.to_string();
    assert!(
        msg.contains("the port returned an error: Shape mismatch"),
        "{msg}"
    );
    assert!(msg.contains("[7, 7]"), "{msg}");
}

#[test]
fn a_port_that_panics_is_reported_not_propagated() {
    let failure = must_fail(&named(gelu_layer(), "gelu_port_panic"), |i| {
        if i.tensor(0).dim(1)? > 3 {
            panic!("index out of range in my port");
        }
        i.tensor(0).gelu_erf()
    });
    let msg = failure.to_string();
    assert!(
        msg.contains("the port panicked: index out of range in my port"),
        "{msg}"
    );
    // Shrinking found the boundary: the smallest n that panics.
    assert_eq!(dims(&failure)[1], ("n".to_string(), 4));
}

#[test]
fn a_missing_transpose_is_named() {
    let layer = Layer::function("linear_missing_transpose", "zoo_ref.linear")
        .dim("b", 1, 4)
        .dim("d_in", 1, 32)
        .dim("d_out", 1, 32)
        .arg("x", ["b", "d_in"], Dist::default())
        .arg("weight", ["d_out", "d_in"], Dist::default())
        .arg("bias", ["d_out"], Dist::default());
    let failure = must_fail(&layer, |i| {
        let y = candle_nn::Linear::new(i.tensor(1).clone(), Some(i.tensor(2).clone()))
            .forward(i.tensor(0))?;
        y.t()?.contiguous()
    });
    let msg = failure.to_string();
    assert!(msg.contains("a missing `.transpose(0, 1)`?"), "{msg}");
}
