//! Faults of the port itself end in the usual report, never in a hang or in golden's own panic: a
//! port that never returns (in the forward, gradient and overfit checks), a port that panics in a
//! backward pass or while training, and a panicking port's backtrace, printed once however often
//! shrinking calls it.

mod common;

use candle_core::{DType, Module, Tensor};
use golden::internal::describe::env::Mode;
use golden::internal::run::{gradients, overfit};
use golden::{DimExpr, Dist, GradSpec, IntoOutputs, Layer, OverfitSpec, PortInputs};

/// A port that never returns: what a deadlock or an endless loop in a port looks like.
fn never_returns() -> ! {
    loop {
        std::thread::park();
    }
}

fn gelu(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.gelu")
        .dim("n", 1, 8)
        .arg("x", ["n"], Dist::default())
        .mode(Mode::Live)
}

fn declared(layer: Layer) -> (Layer, common::Scratch) {
    let scratch = common::Scratch::new(layer.name());
    (layer.declared_at(scratch.declared), scratch)
}

#[test]
fn a_port_that_never_returns_fails_at_the_timeout_on_its_case() {
    let (layer, _scratch) = declared(gelu("stuck_forward").timeout(5.0));
    // Right on small cases, stuck from n = 5 on: the case that got stuck is the one reported.
    let port = |i: &PortInputs| {
        if i.tensor(0).dims()[0] >= 5 {
            never_returns();
        }
        i.tensor(0).gelu_erf().into_outputs()
    };
    let f = golden::check(&layer, &port).expect_err("a port that never returns fails");
    let msg = f.to_string();
    let case = f.case.clone().expect("the case that got stuck");
    assert!(case.dim("n").unwrap() >= 5, "{msg}");
    assert!(
        msg.contains(&format!("the port did not return within 5 s on {case}")),
        "{msg}"
    );
    assert!(
        msg.contains("keeps running on its own thread until the test process ends"),
        "{msg}"
    );
    // Not shrunk: every try would wait the whole timeout again.
    assert!(f.shrunk_from.is_none(), "{msg}");
    // The case can be re-run alone.
    assert!(
        msg.contains("re-run exactly this case: GOLDEN_CASE='"),
        "{msg}"
    );
    // The next check of this process is not disturbed by the abandoned thread.
    let (layer, _scratch) = declared(gelu("after_stuck_forward").timeout(5.0));
    let right = |i: &PortInputs| i.tensor(0).gelu_erf().into_outputs();
    golden::check(&layer, &right).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn every_call_of_the_gradient_check_is_bounded_even_in_float64() {
    // Right in the case dtype; stuck in float64, which only the finite differences use.
    let (layer, _scratch) = declared(
        Layer::function("stuck_in_f64", "torch.square")
            .dim("n", 1, 8)
            .arg("x", ["n"], Dist::default())
            .grad(GradSpec::default())
            .timeout(5.0)
            .mode(Mode::Live),
    );
    let port = |i: &PortInputs| {
        if i.tensor(0).dtype() == DType::F64 {
            never_returns();
        }
        i.tensor(0).sqr().into_outputs()
    };
    let f = gradients::check(&layer, &port).expect_err("a stuck port fails");
    let msg = f.to_string();
    let case = f.case.clone().expect("a case");
    assert!(
        msg.contains(&format!("the port did not return within 5 s on {case}")),
        "{msg}"
    );
}

#[test]
fn a_port_that_never_returns_while_training_fails_at_the_timeout() {
    let (layer, _scratch) = declared(
        Layer::module("stuck_training", "zoo_ref.MLP")
            .init("d_model", 4usize)
            .init("hidden", 8usize)
            .dim("b", 2, 2)
            .arg("x", ["b".into(), DimExpr::Lit(4)], Dist::default())
            .overfit(OverfitSpec {
                steps: 3,
                ..OverfitSpec::default()
            })
            .timeout(5.0)
            .mode(Mode::Live),
    );
    let port = |_: &PortInputs| -> Result<golden::Outputs, String> { never_returns() };
    let f = overfit::check(&layer, &port).expect_err("a stuck port fails");
    let msg = f.to_string();
    let case = f.case.clone().expect("the batch");
    assert!(
        msg.contains(&format!("the port did not return within 5 s on {case}")),
        "{msg}"
    );
}

#[test]
fn a_panic_in_the_training_s_backward_is_the_port_s_panic() {
    // A custom op whose backward panics: the panic is the port's, reported as such.
    struct PanicsBackward;
    impl candle_core::CustomOp1 for PanicsBackward {
        fn name(&self) -> &'static str {
            "panics_backward"
        }
        fn cpu_fwd(
            &self,
            s: &candle_core::CpuStorage,
            l: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            let (start, end) = l.contiguous_offsets().expect("contiguous");
            match s {
                candle_core::CpuStorage::F32(v) => Ok((
                    candle_core::CpuStorage::F32(v[start..end].to_vec()),
                    l.shape().clone(),
                )),
                _ => candle_core::bail!("f32 only"),
            }
        }
        fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> candle_core::Result<Option<Tensor>> {
            panic!("my backward is not written yet");
        }
    }
    let (layer, _scratch) = declared(
        Layer::module("panics_training", "zoo_ref.MLP")
            .init("d_model", 4usize)
            .init("hidden", 8usize)
            .dim("b", 2, 2)
            .arg("x", ["b".into(), DimExpr::Lit(4)], Dist::default())
            .overfit(OverfitSpec {
                steps: 3,
                ..OverfitSpec::default()
            })
            .mode(Mode::Live),
    );
    fn mlp(i: &PortInputs) -> candle_core::Result<Tensor> {
        let vb = i.var_builder();
        let fc1 = candle_nn::linear(4, 8, vb.pp("fc1"))?;
        let fc2 = candle_nn::linear(8, 4, vb.pp("fc2"))?;
        let h = fc1.forward(i.tensor(0))?.gelu_erf()?;
        fc2.forward(&h.contiguous()?.apply_op1(PanicsBackward)?)
    }
    let port = |i: &PortInputs| mlp(i).into_outputs();
    let f = overfit::check(&layer, &port).expect_err("a panicking backward fails");
    let msg = f.to_string();
    assert!(
        msg.contains("the port panicked") && msg.contains("my backward is not written yet"),
        "{msg}"
    );
}

/// Run this test binary again with only `test`, `RUST_BACKTRACE=1` and `GOLDEN_PORT_FAULTS_CHILD`
/// set; returns its stderr.
fn rerun_as_child(test: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("RUST_BACKTRACE", "1")
        .env("GOLDEN_PORT_FAULTS_CHILD", "1")
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn a_panicking_port_prints_its_backtrace_once_however_often_shrinking_calls_it() {
    if std::env::var_os("GOLDEN_PORT_FAULTS_CHILD").is_none() {
        let stderr = rerun_as_child(
            "a_panicking_port_prints_its_backtrace_once_however_often_shrinking_calls_it",
        );
        let panics = stderr.matches("index out of range in my port").count();
        let backtraces = stderr.matches("stack backtrace:").count();
        assert_eq!((panics, backtraces), (1, 1), "{stderr}");
        return;
    }
    let (layer, _scratch) = declared(
        Layer::function("panics_while_shrinking", "zoo_ref.gelu")
            .dim("n", 1, 8)
            .dim("m", 1, 8)
            .arg("x", ["n", "m"], Dist::default())
            .mode(Mode::Live),
    );
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let port = move |i: &PortInputs| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if i.tensor(0).dims()[0] >= 3 {
            panic!("index out of range in my port");
        }
        i.tensor(0).gelu_erf().into_outputs()
    };
    let f = golden::check(&layer, &port).expect_err("a panicking port fails");
    let msg = f.to_string();
    assert!(
        msg.contains("the port panicked: index out of range in my port"),
        "{msg}"
    );
    // Shrinking called the port on several panicking cases.
    let (_, steps) = f.shrunk_from.clone().expect("shrunk");
    assert!(steps > 1, "{msg}");
    assert!(calls.load(std::sync::atomic::Ordering::SeqCst) > 2);
}
