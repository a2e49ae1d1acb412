//! Comparison speed, printed (not asserted): `cargo bench -p golden --bench compare`.
//!
//! Two 10^7-element f32 tensors that agree within tolerance (so every element is examined),
//! compared by golden's `compare_all` (with and without a rounding estimate per element) and by
//! `torch.testing.assert_close` on the same data, in one run. torch gets the tensors from `.npy`
//! files; only the `assert_close` call is timed.

use golden::internal::describe::inputs::float_tensor;
use golden::internal::judge::compare::{compare_all, Expected, ROUNDING_FACTOR};
use golden_files::HostTensor;
use std::time::{Duration, Instant};

const N: usize = 10_000_000;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

const ASSERT_CLOSE: &str = r#"
import sys, time, numpy as np, torch
a = torch.from_numpy(np.load(sys.argv[1], allow_pickle=False))
b = torch.from_numpy(np.load(sys.argv[2], allow_pickle=False))
torch.testing.assert_close(a, b)
times = []
for _ in range(5):
    start = time.perf_counter()
    torch.testing.assert_close(a, b)
    times.append(time.perf_counter() - start)
times.sort()
print(times[2], torch.get_num_threads())
"#;

fn main() {
    // A deterministic spread of magnitudes, and a port that differs by ~1e-7 relative.
    let reference: Vec<f64> = (0..N)
        .map(|i| ((i as f64) * 0.618_033_988_7).fract() * 20.0 - 10.0)
        .collect();
    let port: Vec<f64> = reference
        .iter()
        .enumerate()
        .map(|(i, r)| r * (1.0 + if i % 2 == 0 { 1e-7 } else { -1e-7 }))
        .collect();
    let shape = vec![1000, 10_000];
    let reference = float_tensor(shape.clone(), &reference, candle_core::DType::F32);
    let port = float_tensor(shape.clone(), &port, candle_core::DType::F32);
    let rounding = float_tensor(shape, &vec![1e-7; N], candle_core::DType::F32);
    let ports = vec![("out".to_string(), port.clone())];

    let time = |rounding: Option<&HostTensor>| {
        let expected = vec![(
            "out".to_string(),
            Expected {
                value: &reference,
                rounding,
                precise: None,
            },
        )];
        let runs: Vec<Duration> = (0..5)
            .map(|_| {
                let started = Instant::now();
                let leaves = compare_all(&ports, &expected, None, ROUNDING_FACTOR);
                let took = started.elapsed();
                assert!(leaves[0].passes(), "the bench data should agree");
                took
            })
            .collect();
        median(runs)
    };
    let plain = time(None);
    let with_rounding = time(Some(&rounding));

    let dir = std::env::temp_dir().join(format!("golden-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("port.npy"), dir.join("reference.npy"));
    golden_files::npy::write(&a, &port).unwrap();
    golden_files::npy::write(&b, &reference).unwrap();
    let out = std::process::Command::new(golden::internal::describe::env::python().program)
        .args(["-c", ASSERT_CLOSE])
        .arg(&a)
        .arg(&b)
        .output()
        .expect("golden's interpreter starts");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let torch = Duration::from_secs_f64(fields.next().unwrap().parse().unwrap());
    let threads = fields.next().unwrap_or("?");

    println!("comparing two f32 tensors of {N} elements (median of 5):");
    println!("  golden compare_all, assert_close's rule:             {plain:.1?}");
    println!("  golden compare_all, + 16 x rounding estimate:        {with_rounding:.1?}");
    println!("  torch.testing.assert_close ({threads} torch threads):    {torch:.1?}");
    println!(
        "  torch / golden: {:.1}x (plain), {:.1}x (with rounding)",
        torch.as_secs_f64() / plain.as_secs_f64(),
        torch.as_secs_f64() / with_rounding.as_secs_f64()
    );
}
