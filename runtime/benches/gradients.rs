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
//! Then how the cost grows with the work: the same layer with x [1, n], weight [100, n], bias
//! [100] for n = 9, 99, 1000, 9999 (about 10^3, 10^4, 10^5 and 10^6 values), both checks in both
//! modes beside each other, and the slope of each curve between sizes (log time / log values: 0
//! is a fixed cost, 1 linear, 2 quadratic). Full mode at 10^6 values is not run (two forward
//! passes of 10^6 multiply-adds per value: hours on either side); its line is extrapolated from
//! 10^5 by the measured quadratic growth, and says so.
//!
//! Needs Python with torch (`cargo xtask setup`). Timings include the port's and PyTorch's work;
//! the worker is started and torch imported before anything is timed.

use golden::internal::describe::env::Mode;
use golden::internal::run::gradients;
use golden::{DimExpr, Dist, IntoOutputs, Layer, PortInputs};
use golden::{GradMode, GradSpec};
use std::process::Command;
use std::time::{Duration, Instant};

/// The output features of every size.
const OUT: usize = 100;

fn layer(n_in: usize, mode: GradMode) -> Layer {
    Layer::function("bench_linear", "zoo_ref.linear")
        .dim("b", 1, 1)
        .arg("x", ["b".into(), DimExpr::Lit(n_in)], Dist::default())
        .arg(
            "weight",
            [DimExpr::Lit(OUT), DimExpr::Lit(n_in)],
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

/// The values checked: x, weight and bias.
fn values(n_in: usize) -> usize {
    n_in + OUT * n_in + OUT
}

fn time_check(n_in: usize, mode: GradMode) -> Duration {
    let started = Instant::now();
    if let Err(f) = gradients::check(&layer(n_in, mode), &port) {
        panic!("the benchmark's linear layer failed its gradient check:\n{f}");
    }
    started.elapsed()
}

const GRADCHECK: &str = r#"
import sys, time, torch
import torch.nn.functional as F
torch.manual_seed(0)
n_in, n_out = int(sys.argv[2]), int(sys.argv[3])
x = torch.randn(1, n_in, dtype=torch.float64, requires_grad=True)
w = torch.randn(n_out, n_in, dtype=torch.float64, requires_grad=True)
b = torch.randn(n_out, dtype=torch.float64, requires_grad=True)
fast = sys.argv[1] == "fast"
start = time.perf_counter()
assert torch.autograd.gradcheck(F.linear, (x, w, b), fast_mode=fast)
print(time.perf_counter() - start)
"#;

fn gradcheck(n_in: usize, mode: &str) -> Duration {
    let python = golden::internal::describe::env::python();
    let out = Command::new(&python.program)
        .args(["-c", GRADCHECK, mode, &n_in.to_string(), &OUT.to_string()])
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

/// The fastest of `runs` measurements.
fn best(runs: usize, f: impl Fn() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().expect("at least one run")
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// One size of the curve: golden fast, torch fast, golden full, torch full (`None`: not run).
struct Point {
    n_in: usize,
    fast: Duration,
    torch_fast: Duration,
    full: Option<Duration>,
    torch_full: Option<Duration>,
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("—".to_string(), |d| format!("{:.3} s", d.as_secs_f64()))
}

/// The slope of log time against log values between two sizes.
fn slope(a: (usize, Duration), b: (usize, Duration)) -> f64 {
    (b.1.as_secs_f64() / a.1.as_secs_f64()).ln() / (values(b.0) as f64 / values(a.0) as f64).ln()
}

fn main() {
    const IN: usize = 1000;
    println!(
        "gradient check of F.linear: x [1, {IN}], weight [{OUT}, {IN}], bias [{OUT}] = {} values",
        values(IN)
    );
    // Start the worker and import torch before timing.
    time_check(IN, GradMode::Fast);
    let fast = best(5, || time_check(IN, GradMode::Fast));
    let torch_fast = best(3, || gradcheck(IN, "fast"));
    println!("  golden, fast mode (one case, with the PyTorch autograd comparison): {fast:.2?}");
    println!(
        "  torch.autograd.gradcheck(fast_mode=True):                          {torch_fast:.2?} \
         (golden {:.1}× faster)",
        ratio(torch_fast, fast)
    );
    let full = time_check(IN, GradMode::Full);
    println!("  golden, full mode (every Jacobian entry):                          {full:.2?}");
    let torch_full = gradcheck(IN, "full");
    println!(
        "  torch.autograd.gradcheck(fast_mode=False):                         {torch_full:.2?} \
         (golden {:.2}× torch's time)",
        ratio(full, torch_full)
    );
    println!(
        "  full / fast: golden {:.0}×, torch {:.0}×",
        ratio(full, fast),
        ratio(torch_full, torch_fast)
    );

    println!("\nhow the cost grows: F.linear with x [1, n], weight [{OUT}, n], bias [{OUT}]");
    let mut points = Vec::new();
    for n_in in [9, 99, IN, 9999] {
        let point = if n_in == IN {
            Point {
                n_in,
                fast,
                torch_fast,
                full: Some(full),
                torch_full: Some(torch_full),
            }
        } else {
            let full_too = n_in < IN;
            Point {
                n_in,
                fast: best(3, || time_check(n_in, GradMode::Fast)),
                torch_fast: best(3, || gradcheck(n_in, "fast")),
                full: full_too.then(|| best(3, || time_check(n_in, GradMode::Full))),
                torch_full: full_too.then(|| best(3, || gradcheck(n_in, "full"))),
            }
        };
        points.push(point);
    }
    println!(
        "  {:>9} | {:>10} | {:>10} | {:>10} | {:>10} | {:>16}",
        "values", "golden fast", "torch fast", "golden full", "torch full", "full: golden/torch"
    );
    for p in &points {
        println!(
            "  {:>9} | {:>11} | {:>10} | {:>11} | {:>10} | {:>18}",
            values(p.n_in),
            secs(Some(p.fast)),
            secs(Some(p.torch_fast)),
            secs(p.full),
            secs(p.torch_full),
            match (p.full, p.torch_full) {
                (Some(a), Some(b)) => format!("{:.2}×", ratio(a, b)),
                _ => "—".to_string(),
            }
        );
    }
    println!("  slopes (log time / log values; 0 fixed cost, 1 linear, 2 quadratic):");
    for w in points.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let pair = |x: Option<Duration>, y: Option<Duration>| match (x, y) {
            (Some(x), Some(y)) => format!("{:.2}", slope((a.n_in, x), (b.n_in, y))),
            _ => "—".to_string(),
        };
        println!(
            "    {:>9} → {:>9}: golden fast {}, torch fast {}, golden full {}, torch full {}",
            values(a.n_in),
            values(b.n_in),
            pair(Some(a.fast), Some(b.fast)),
            pair(Some(a.torch_fast), Some(b.torch_fast)),
            pair(a.full, b.full),
            pair(a.torch_full, b.torch_full)
        );
    }
    // Full mode at 10^6 values: not run; extrapolated from 10^5 with the slope measured between
    // 10^4 and 10^5.
    if let [.., p4, p5, p6] = points.as_slice() {
        let extrapolate = |x: Option<Duration>, y: Option<Duration>| -> String {
            let (Some(x), Some(y)) = (x, y) else {
                return "—".to_string();
            };
            let k = slope((p4.n_in, x), (p5.n_in, y));
            let grow = (values(p6.n_in) as f64 / values(p5.n_in) as f64).powf(k);
            format!("~{:.0} min", y.as_secs_f64() * grow / 60.0)
        };
        println!(
            "  full mode at {} values, NOT RUN, extrapolated from 10^5 with the 10^4 → 10^5 slope: \
             golden {}, torch {}",
            values(p6.n_in),
            extrapolate(p4.full, p5.full),
            extrapolate(p4.torch_full, p5.torch_full)
        );
    }
}
