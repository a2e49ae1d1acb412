//! Gradient-check figures, printed (not asserted): `cargo bench -p golden --bench gradients`.
//!
//! One layer with about 10^5 inputs plus parameters, `F.linear(x, weight, bias)` with x [1, 1000],
//! weight [100, 1000], bias [100] (101,100 values), checked three ways in one run:
//!
//! * golden's gradient check of one case, fast mode (a directional derivative per input, plus the
//!   autograd comparison with PyTorch);
//! * the same in full mode (every Jacobian entry by central differences);
//! * `torch.autograd.gradcheck(F.linear, (x, weight, bias), fast_mode=True)` in float64, and with
//!   `fast_mode=False`, in golden's interpreter.
//!
//! Needs Python with torch (`cargo xtask setup`). Timings include the port's and PyTorch's work;
//! the worker is started and torch imported before anything is timed.

use golden::describe::env::Mode;
use golden::run::gradients;
use golden::{DimExpr, Dist, IntoOutputs, Layer, PortInputs};
use golden::{GradMode, GradSpec};
use std::process::Command;
use std::time::{Duration, Instant};

const IN: usize = 1000;
const OUT: usize = 100;

fn layer(mode: GradMode) -> Layer {
    Layer::function("bench_linear", "zoo_ref.linear")
        .dim("b", 1, 1)
        .arg("x", ["b".into(), DimExpr::Lit(IN)], Dist::default())
        .arg(
            "weight",
            [DimExpr::Lit(OUT), DimExpr::Lit(IN)],
            Dist::default(),
        )
        .arg("bias", [DimExpr::Lit(OUT)], Dist::default())
        .mode(Mode::Live)
        .grad(GradSpec {
            mode,
            cases: 1,
            ..GradSpec::default()
        })
}

fn port(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0)
        .matmul(&i.tensor(1).t().unwrap())
        .and_then(|y| y.broadcast_add(i.tensor(2)))
        .into_outputs()
}

fn time_check(mode: GradMode) -> Duration {
    let started = Instant::now();
    if let Err(f) = gradients::check(&layer(mode), &port) {
        panic!("the benchmark's linear layer failed its gradient check:\n{f}");
    }
    started.elapsed()
}

const GRADCHECK: &str = r#"
import sys, time, torch
import torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(1, 1000, dtype=torch.float64, requires_grad=True)
w = torch.randn(100, 1000, dtype=torch.float64, requires_grad=True)
b = torch.randn(100, dtype=torch.float64, requires_grad=True)
fast = sys.argv[1] == "fast"
start = time.perf_counter()
assert torch.autograd.gradcheck(F.linear, (x, w, b), fast_mode=fast)
print(time.perf_counter() - start)
"#;

fn gradcheck(mode: &str) -> Duration {
    let python = golden::describe::env::python();
    let out = Command::new(&python.program)
        .args(["-c", GRADCHECK, mode])
        .output()
        .expect("golden's interpreter starts");
    assert!(
        out.status.success(),
        "gradcheck failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seconds: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("gradcheck prints its time");
    Duration::from_secs_f64(seconds)
}

fn main() {
    let values = IN + OUT * IN + OUT;
    println!("gradient check of F.linear: x [1, {IN}], weight [{OUT}, {IN}], bias [{OUT}] = {values} values");
    // Start the worker and import torch before timing.
    time_check(GradMode::Fast);
    let fast: Vec<Duration> = (0..5).map(|_| time_check(GradMode::Fast)).collect();
    let fast = *fast.iter().min().unwrap();
    let torch_fast = (0..3).map(|_| gradcheck("fast")).min().unwrap();
    println!("  golden, fast mode (one case, with the PyTorch autograd comparison): {fast:.2?}");
    println!(
        "  torch.autograd.gradcheck(fast_mode=True):                          {torch_fast:.2?}"
    );
    let full = time_check(GradMode::Full);
    println!("  golden, full mode (every Jacobian entry):                          {full:.2?}");
    let torch_full = gradcheck("full");
    println!(
        "  torch.autograd.gradcheck(fast_mode=False):                         {torch_full:.2?}"
    );
    println!(
        "  full / fast: golden {:.0}×, torch {:.0}×",
        full.as_secs_f64() / fast.as_secs_f64(),
        torch_full.as_secs_f64() / torch_fast.as_secs_f64()
    );
}
