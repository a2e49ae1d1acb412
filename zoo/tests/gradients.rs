//! The gradient check catches wrong gradients: custom backward passes that are off by a factor, of
//! the wrong sign or blind to the incoming gradient, a detached intermediate, candle's fused ops that
//! have no backward, and two gradients of candle 0.11.1 itself that golden found wrong; a wrong
//! backward inside a port of Hugging Face's Llama decoder layer is shrunk on directional derivatives
//! and located by Jacobians once, on the smallest case. Stores in `tests/golden/`, so these hold in
//! replay too.

mod common;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Module, Result, Shape, Tensor, D};
use common::must_fail_check;
use golden::internal::run::gradients;
use golden::GradSpec;
use golden::{Dist, Failure, IntoOutputs, Layer, PortInputs};

fn grad_issues(f: &Failure) -> String {
    let msg = f.to_string();
    let start = msg
        .find("the port's gradients:")
        .unwrap_or_else(|| panic!("no gradient issue in:\n{msg}"));
    msg[start..].to_string()
}

/// `x²` with a hand-written backward `factor · x · grad` (2 is right).
struct Square {
    factor: f64,
    /// A backward that ignores the incoming gradient (returns `factor · x`).
    ignores_grad: bool,
}

impl CustomOp1 for Square {
    fn name(&self) -> &'static str {
        "square"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("square: contiguous input only".into()))?;
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(v[start..end].iter().map(|x| x * x).collect()),
            CpuStorage::F64(v) => CpuStorage::F64(v[start..end].iter().map(|x| x * x).collect()),
            _ => candle_core::bail!("square: f32 or f64 only"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let local = (arg * self.factor)?;
        Ok(Some(if self.ignores_grad {
            local
        } else {
            (local * grad_res)?
        }))
    }
}

fn square_layer(name: &str) -> Layer {
    Layer::function(name, "torch.square")
        .dim("b", 1, 4)
        .dim("n", 1, 32)
        .arg("x", ["b", "n"], Dist::default())
        .grad(GradSpec::default())
}

fn square(factor: f64, ignores_grad: bool) -> impl Fn(&PortInputs) -> Result<Tensor> + Clone {
    move |i| {
        i.tensor(0).contiguous()?.apply_op1(Square {
            factor,
            ignores_grad,
        })
    }
}

#[test]
fn a_correct_custom_backward_passes() {
    let scratch = common::Scratch::new("g_square_right");
    let layer = common::declared_with_store(&square_layer("g_square_right"), &scratch);
    let port = |i: &PortInputs| square(2.0, false)(i).into_outputs();
    gradients::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_custom_backward_off_by_two_is_caught_by_both_checks() {
    let f = must_fail_check(
        gradients::check,
        &square_layer("g_square_times_two"),
        square(4.0, false),
    );
    let issues = grad_issues(&f);
    // Finite differences: the worst Jacobian entry, twice the numeric one.
    assert!(
        issues.contains("in the port's backward") && issues.contains("(2× the finite difference)"),
        "{issues}"
    );
    assert!(
        issues.contains("likely cause: the port's backward is not the derivative"),
        "{issues}"
    );
    // PyTorch's autograd: grad.x differs.
    assert!(f.to_string().contains("leaf `grad.x`"), "{f}");
    assert!(
        f.to_string()
            .starts_with("golden: the gradients of `g_square_times_two` do not match"),
        "{f}"
    );
}

#[test]
fn a_custom_backward_with_the_wrong_sign_is_caught() {
    let f = must_fail_check(
        gradients::check,
        &square_layer("g_square_negated"),
        square(-2.0, false),
    );
    assert!(
        grad_issues(&f).contains("(-1× the finite difference)"),
        "{f}"
    );
}

#[test]
fn a_backward_that_ignores_the_incoming_gradient_is_caught() {
    let f = must_fail_check(
        gradients::check,
        &square_layer("g_square_blind"),
        square(2.0, true),
    );
    assert!(
        grad_issues(&f).contains("a zero cotangent gives `x` a non-zero gradient"),
        "{f}"
    );
}

#[test]
fn a_detached_intermediate_stops_the_gradient() {
    let layer = Layer::function("g_linear_detached", "zoo_ref.linear")
        .dim("b", 1, 4)
        .dim("d", 1, 16)
        .dim("e", 1, 16)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", ["e", "d"], Dist::default())
        .arg("bias", ["e"], Dist::default())
        .grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| {
        i.tensor(0)
            .matmul(&i.tensor(1).t()?)?
            .detach()
            .broadcast_add(i.tensor(2))
    });
    let issues = grad_issues(&f);
    assert!(
        issues.contains("`x` gets a gradient in PyTorch and none in the port"),
        "{issues}"
    );
    assert!(
        issues.contains("`weight` gets a gradient in PyTorch and none in the port"),
        "{issues}"
    );
    assert!(
        issues.contains("a fused op without backward") && issues.contains("or at a detach"),
        "{issues}"
    );
}

fn norm_layer(name: &str, reference: &str) -> Layer {
    let layer = Layer::function(name, reference)
        .dim("b", 1, 4)
        .dim("d", 2, 16)
        .arg("x", ["b", "d"], Dist::default())
        .arg("weight", ["d"], Dist::normal(1.0, 0.1));
    let layer = if reference.ends_with("layer_norm") {
        layer
            .arg("bias", ["d"], Dist::normal(0.0, 0.1))
            .konst("eps", 1e-5)
    } else {
        layer.konst("eps", 1e-6)
    };
    layer.grad(GradSpec::default())
}

#[test]
fn candle_layer_norm_forward_takes_the_fused_path_without_backward() {
    let f = must_fail_check(
        gradients::check,
        &norm_layer("g_fused_layer_norm", "zoo_ref.layer_norm"),
        |i| {
            candle_nn::LayerNorm::new(i.tensor(1).clone(), i.tensor(2).clone(), 1e-5)
                .forward(i.tensor(0))
        },
    );
    assert!(
        grad_issues(&f).contains("gets a gradient in PyTorch and none in the port"),
        "{f}"
    );
}

#[test]
fn candle_rms_norm_forward_takes_the_fused_path_without_backward() {
    let f = must_fail_check(
        gradients::check,
        &norm_layer("g_fused_rms_norm", "zoo_ref.rms_norm"),
        |i| candle_nn::RmsNorm::new(i.tensor(1).clone(), 1e-6).forward(i.tensor(0)),
    );
    assert!(
        grad_issues(&f).contains("gets a gradient in PyTorch and none in the port"),
        "{f}"
    );
}

#[test]
fn candle_softmax_last_dim_has_no_backward() {
    let layer = Layer::function("g_fused_softmax", "zoo_ref.softmax")
        .dim("b", 1, 4)
        .dim("n", 2, 32)
        .arg("x", ["b", "n"], Dist::default())
        .grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| {
        candle_nn::ops::softmax_last_dim(i.tensor(0))
    });
    assert!(
        grad_issues(&f).contains("`x` gets a gradient in PyTorch and none in the port"),
        "{f}"
    );
}

#[test]
fn candle_conv1d_backward_with_a_stride_is_wrong() {
    // Found by golden on the zoo's conv1d: the weight gradient of candle 0.11.1's conv1d is wrong
    // when stride > 1 (checked by hand on b=2, c_in=1, k=1, stride 2, padding 2: -0.185 where the
    // sum over the windows gives -0.060). The zoo's conv1d unfolds the windows instead.
    let layer = Layer::function("g_candle_conv1d", "zoo_ref.conv1d")
        .dim("b", 1, 3)
        .dim("c_in", 1, 8)
        .dim("c_out", 1, 8)
        .dim("t", 5, 24)
        .dim("k", 1, 5)
        .arg("x", ["b", "c_in", "t"], Dist::default())
        .arg("weight", ["c_out", "c_in", "k"], Dist::normal(0.0, 0.2))
        .arg("bias", ["c_out"], Dist::default())
        .konst("stride", 2)
        .konst("padding", 2)
        .grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| {
        i.tensor(0)
            .conv1d(i.tensor(1), 2, 2, 1, 1)?
            .broadcast_add(&i.tensor(2).reshape((1, (), 1))?)
    });
    let issues = grad_issues(&f);
    assert!(issues.contains("`weight`: ∂out"), "{issues}");
    assert!(f.to_string().contains("leaf `grad.weight`"), "{f}");
    // The cause: a backward, here candle's own, not the port's forward.
    assert!(
        issues
            .contains("likely cause: the port's backward is not the derivative of its own forward")
            && issues.contains("candle 0.11.1's `conv1d` backward is one"),
        "{issues}"
    );
}

#[test]
fn candle_gelu_backward_constants_show_in_f64() {
    // The backward of candle's tanh GELU hard-codes 6-digit constants (0.797885 for √(2/π)): 2e-6
    // relative, below f32's tolerance, above f64's.
    let layer = Layer::function("g_candle_gelu_f64", "zoo_ref.gelu_tanh")
        .dim("n", 1, 64)
        .arg("x", ["n"], Dist::default())
        .dtypes(&[DType::F32, DType::F64])
        .grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| i.tensor(0).gelu());
    let msg = f.to_string();
    assert!(
        msg.contains("do not match (reference `zoo_ref.gelu_tanh`) in f64"),
        "f32 passes, f64 fails:\n{msg}"
    );
    assert!(msg.contains("leaf `grad.x` (f64"), "{msg}");
    let _ = D::Minus1;
}

#[test]
fn candle_conv1d_backward_panics_on_an_input_of_length_one() {
    // candle 0.11.1's conv1d backward panics (`attempt to subtract with overflow`) when a padded
    // input has length 1: reported as the port's panic on the smallest case that triggers it, as
    // for any panicking port, not as golden's own.
    let layer = Layer::function("g_candle_conv1d_length_one", "zoo_ref.conv1d")
        .dim("b", 1, 2)
        .dim("c", 1, 3)
        .dim("t", 1, 6)
        .arg("x", ["b", "c", "t"], Dist::default())
        .arg(
            "weight",
            ["c".into(), "c".into(), golden::DimExpr::Lit(3)],
            Dist::normal(0.0, 0.2),
        )
        .arg("bias", ["c"], Dist::default())
        .konst("padding", 1)
        .grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| {
        i.tensor(0)
            .conv1d(i.tensor(1), 1, 1, 1, 1)?
            .broadcast_add(&i.tensor(2).reshape((1, (), 1))?)
    });
    let msg = f.to_string();
    assert!(
        msg.contains("the port panicked: attempt to subtract with overflow"),
        "{msg}"
    );
    assert_eq!(f.case.as_ref().and_then(|c| c.dim("t")), Some(1), "{msg}");
}

// --- A SwiGLU MLP (Hugging Face's LlamaMLP) with a hand-written SiLU whose backward is wrong ----

/// SiLU with the common wrong backward `σ(x) · grad` (the derivative of x·σ(x) is
/// `σ(x)·(1 + x·(1 − σ(x)))`).
struct SiluSigmoidBackward;

impl CustomOp1 for SiluSigmoidBackward {
    fn name(&self) -> &'static str {
        "silu-sigmoid-backward"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("silu: contiguous input only".into()))?;
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(
                v[start..end]
                    .iter()
                    .map(|x| x / (1.0 + (-x).exp()))
                    .collect(),
            ),
            CpuStorage::F64(v) => CpuStorage::F64(
                v[start..end]
                    .iter()
                    .map(|x| x / (1.0 + (-x).exp()))
                    .collect(),
            ),
            _ => candle_core::bail!("silu: f32 or f64 only"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some((candle_nn::ops::sigmoid(arg)? * grad_res)?))
    }
}

#[test]
fn a_wrong_backward_in_a_llama_decoder_layer_is_shrunk_cheaply_and_located_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let started = std::time::Instant::now();
    let layer = common::llama::decoder_layer("g_llama_decoder_silu").grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, move |i| {
        counted.fetch_add(1, Ordering::Relaxed);
        common::llama::decoder_with_silu(
            i.var_builder(),
            i.tensor(0),
            common::llama::Port::default(),
            |g| g.contiguous()?.apply_op1(SiluSigmoidBackward),
        )
    });
    let calls = calls.load(Ordering::Relaxed);
    let (_, steps) = f.shrunk_from.clone().expect("shrunk");
    // A figure for the book (docs/src/gradients.md), not an assertion.
    eprintln!(
        "a failing gradient check (Llama decoder layer, wrong SiLU backward): {:.1} s, {calls} \
         calls of the port, {steps} shrinking steps",
        started.elapsed().as_secs_f64()
    );
    let msg = f.to_string();
    let issues = grad_issues(&f);
    // Located on the smallest case: the worst Jacobian entry of each input and parameter whose
    // gradient the wrong backward reaches, against finite differences.
    assert_eq!(f.case.as_ref().and_then(|c| c.dim("t")), Some(1), "{msg}");
    for target in ["x", "layer.mlp.gate_proj.weight"] {
        assert!(
            issues.contains(&format!("- `{target}`: ∂out[0, 0, "))
                && issues.contains(&format!("]/∂{target}[")),
            "{target}: {issues}"
        );
    }
    assert!(issues.contains("in the port's backward"), "{issues}");
    // The MLP's other weights get their gradients without the activation's backward.
    assert!(!issues.contains("`layer.mlp.up_proj.weight`"), "{issues}");
    assert!(!issues.contains("`layer.mlp.down_proj.weight`"), "{issues}");
    // Shrinking compared directional derivatives only (a few dozen calls of the port per case);
    // the Jacobians (two forward passes per input element, a backward per output element) were
    // computed once, on the smallest case: b = t = 1, at most 16 + 9 · 256 + 3 · 512 input
    // elements.
    let evaluated = (f.passed_before + steps + 4) as usize;
    let jacobians = 2 * (16 + 256 * 3 + 128 * 2 + 512 * 3 + 16 * 2) + 16 * 10;
    assert!(
        calls <= evaluated * 60 + jacobians,
        "{calls} calls of the port for {evaluated} cases"
    );
    // The case's cotangents are left beside its inputs and both sides' gradients, with a repro.py.
    assert!(
        msg.contains("and a repro.py that runs PyTorch's gradient again"),
        "{msg}"
    );
    let dir = std::path::PathBuf::from(msg.lines().last().unwrap().trim());
    for file in [
        "cotangents/out.npy",
        "inputs/x.npy",
        "reference/grad.x.npy",
        "port/grad.x.npy",
        "repro.py",
        "case.json",
    ] {
        assert!(dir.join(file).is_file(), "{file} in {}", dir.display());
    }
}

/// A port whose forward is wrong (rotary embeddings on interleaved pairs in a Llama decoder layer)
/// fails the gradient check too; the failure says first that the forward differs, and does not
/// blame the backward (which is the derivative of the port's own, wrong, forward).
#[test]
fn a_wrong_forward_is_said_first_and_the_backward_is_not_blamed() {
    let layer = common::llama::decoder_layer("g_llama_rope_pairs").grad(GradSpec::default());
    let f = must_fail_check(gradients::check, &layer, |i| {
        common::llama::decoder(
            i.var_builder(),
            i.tensor(0),
            common::llama::Port {
                rope_on_pairs: true,
                ..Default::default()
            },
        )
    });
    let msg = f.to_string();
    assert!(
        msg.starts_with(
            "golden: the gradients of `g_llama_rope_pairs` do not match, and neither does its \
             forward"
        ),
        "{msg}"
    );
    let issues = grad_issues(&f);
    // The first finding listed.
    assert!(
        issues.lines().nth(1).is_some_and(
            |l| l.starts_with("    - the forward differs too: the port's outputs `out` (")
        ),
        "{issues}"
    );
    assert!(issues.contains("fix the forward first"), "{issues}");
    assert!(
        !msg.contains("the port's backward is not the derivative of its own forward"),
        "{msg}"
    );
}
