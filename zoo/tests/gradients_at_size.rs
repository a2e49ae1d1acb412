//! The gradient check at size: from a million values in its inputs and parameters (a real decoder
//! layer has several) the gradients are compared with PyTorch's along one random direction per
//! target (gradcheck's fast mode, vᵀJu), a wrong entry is located by halving directional
//! derivatives instead of a Jacobian of millions of evaluations, and where the gradient stops at
//! one of candle's ops without a backward the failure names the step and the op (on Hugging Face's
//! Llama decoder layer against its candle port, `zoo/examples/bench_scale/decoder.rs`; `cargo xtask
//! bench-scale` checks it at SmolLM2's and Qwen2.5's widths, in release). A million values on a
//! SiLU here: the debug build of the tests runs candle unoptimised.

#![allow(clippy::result_large_err)]

#[path = "../examples/bench_scale/decoder.rs"]
#[allow(dead_code)] // the benchmark uses the rest
mod decoder;

use decoder::{Dims, SiluSigmoidBackward, Variant};
use golden::internal::run::gradients;
use golden::{Dist, Failure, GradSpec, IntoOutputs, Layer, Report};

/// A small one, quick to check.
const SMALL: Dims = Dims {
    hidden: 32,
    heads: 4,
    kv_heads: 2,
    intermediate: 64,
};

fn check(name: &str, dims: Dims, variant: Variant) -> Result<Report, Failure> {
    let spec = GradSpec {
        cases: 2,
        ..GradSpec::default()
    };
    let layer: Layer = decoder::layer(name, dims, 8).grad(spec);
    let port = move |inputs: &golden::PortInputs| {
        decoder::decoder(inputs.var_builder(), inputs.tensor(0), dims, variant).into_outputs()
    };
    gradients::check(&layer, &port)
}

fn issues(f: &Failure) -> String {
    match &f.kind {
        golden::FailureKind::Case(c) => c
            .gradient_issues
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        other => panic!("not a case's failure: {other:?}\n{f}"),
    }
}

/// `zoo_ref.silu` on x [1024, 1024]: a million values, the input the one target.
fn silu_at_size(name: &str) -> Layer {
    let spec = GradSpec {
        cases: 2,
        ..GradSpec::default()
    };
    Layer::function(name, "zoo_ref.silu")
        .dim("n", 1024, 1024)
        .arg("x", ["n", "n"], Dist::default())
        .grad(spec)
}

#[test]
fn a_million_values_are_compared_with_pytorch_along_a_direction() {
    let port = |inputs: &golden::PortInputs| inputs.tensor(0).silu().into_outputs();
    let report =
        gradients::check(&silu_at_size("ga_silu"), &port).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    assert!(
        snapshot.contains("compared with PyTorch's along one random unit direction each"),
        "{snapshot}"
    );
    // One scalar per target: the derivative along the direction.
    assert!(snapshot.contains("  grad.x f32 []"), "{snapshot}");
}

#[test]
fn a_wrong_backward_at_size_fails_along_its_direction_and_is_located_by_halving() {
    let port = |inputs: &golden::PortInputs| {
        inputs
            .tensor(0)
            .contiguous()
            .and_then(|x| x.apply_op1(SiluSigmoidBackward))
            .into_outputs()
    };
    let f = gradients::check(&silu_at_size("ga_silu_backward"), &port)
        .expect_err("a wrong SiLU backward passed");
    let msg = f.to_string();
    // PyTorch's derivative along the direction disagrees with the port's.
    assert!(msg.contains("grad.x"), "{msg}");
    let issues = issues(&f);
    assert!(
        issues.contains("∂sum(`out` · cotangent)/∂x[")
            && issues.contains("found by halving directional derivatives"),
        "{issues}"
    );
}

#[test]
fn a_fused_rms_norm_is_named_where_the_gradient_stops() {
    let f = check("ga_rms_norm", SMALL, Variant::FusedRmsNorm)
        .expect_err("a fused rms_norm kept its gradients");
    let issues = issues(&f);
    assert!(
        issues.contains(
            "`layer.input_layernorm.weight` gets a gradient in PyTorch and none in the port: the \
             gradient stops at the port's tap `layer.input_layernorm`"
        ) && issues.contains(
            "`layer.post_attention_layernorm.weight` gets a gradient in PyTorch and none in the \
             port: the gradient stops at the port's tap `layer.post_attention_layernorm`"
        ) && issues.contains("candle_nn::ops::rms_norm (which RmsNorm::forward takes")
            && issues.contains("use candle_nn::ops::rms_norm_slow"),
        "{issues}"
    );
}

#[test]
fn a_fused_rotary_embedding_is_named_where_the_gradient_stops() {
    let f =
        check("ga_rope", SMALL, Variant::FusedRope).expect_err("a fused rope kept its gradients");
    let issues = issues(&f);
    assert!(
        issues.contains(
            "`layer.self_attn.q_proj.weight` gets a gradient in PyTorch and none in the port: the \
             gradient stops at the port's tap `q_rot`"
        ) && issues.contains("candle_nn::rotary_emb::rope, rope_i or rope_thd")
            && !issues.contains("ops::rms_norm"),
        "{issues}"
    );
}

#[test]
fn a_faithful_decoder_layer_passes() {
    let report = check("ga_faithful", SMALL, Variant::Faithful).unwrap_or_else(|f| panic!("{f}"));
    assert!(report.snapshot().is_some(), "every case ran");
}

#[test]
fn a_fused_softmax_is_among_the_ops_named_by_the_parameters_it_cuts_off() {
    // No tap leaves the graph here (the attention's output keeps the values' gradient): the
    // parameters that get none pick the ops that fit what feeds them.
    let f = check("ga_softmax", SMALL, Variant::FusedSoftmax)
        .expect_err("a fused softmax kept its gradients");
    let issues = issues(&f);
    assert!(
        issues.contains(
            "`layer.self_attn.q_proj.weight` gets a gradient in PyTorch and none in the port"
        ) && issues.contains("candle_nn::ops::softmax_last_dim (use candle_nn::ops::softmax")
            && !issues.contains("ops::rms_norm"),
        "{issues}"
    );
}
