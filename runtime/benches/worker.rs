//! Worker figures, printed (not asserted): `cargo bench -p golden --bench worker`.
//!
//! * per-case round trip of a 1k-element f32 identity reference (`torch.clone`) through the
//!   persistent worker — transport only, and as checks use it (with the float64 and four nudged
//!   evaluations) — beside spawning a fresh interpreter per case (start-up, `import torch`, one call);
//! * throughput for a 64 MiB f32 tensor each way.
//!
//! All figures come from one run on one machine, so their ratios are what to read.

use golden::describe::inputs::float_tensor;
use golden::python::key::WorkerKey;
use golden::python::wire::TensorTable;
use golden::python::worker::Worker;
use golden_files::HostTensor;
use serde_json::json;
use std::time::{Duration, Instant};

fn forward(worker: &mut Worker, x: &HostTensor, precise: bool) {
    let mut table = TensorTable::default();
    let arg = table.add(x.clone());
    let header = json!({
        "op": "forward", "reference": "torch.clone", "form": "function", "backend": "torch",
        "seed": 0, "dtype": "f32", "args": [arg], "kwargs": {}, "init": {},
        "precise": precise, "perturbations": 4,
    });
    let (response, tensors) = worker
        .request(
            header,
            table.tensors,
            Duration::from_secs(600),
            "benchmarking",
        )
        .expect("the identity reference answers");
    assert_eq!(response["ok"], true);
    assert_eq!(tensors[0].data.len(), x.data.len());
}

fn load(worker: &mut Worker) {
    let header =
        json!({"op": "load", "reference": "torch.clone", "form": "function", "backend": "torch"});
    worker
        .request(header, Vec::new(), Duration::from_secs(600), "loading")
        .expect("torch imports");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let key = WorkerKey::from_env(Some(env!("CARGO_MANIFEST_DIR")));
    let values: Vec<f64> = (0..1024).map(|i| i as f64 / 1024.0).collect();
    let small = float_tensor(vec![1024], &values, candle_core::DType::F32);

    let mut worker = Worker::spawn(&key).expect("a worker starts");
    load(&mut worker);
    for _ in 0..20 {
        forward(&mut worker, &small, false);
    }
    let transport: Vec<Duration> = (0..500)
        .map(|_| {
            let t = Instant::now();
            forward(&mut worker, &small, false);
            t.elapsed()
        })
        .collect();
    let as_checked: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            forward(&mut worker, &small, true);
            t.elapsed()
        })
        .collect();

    let fresh: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let mut w = Worker::spawn(&key).expect("a worker starts");
            load(&mut w);
            forward(&mut w, &small, false);
            drop(w);
            t.elapsed()
        })
        .collect();

    let n = 16 * 1024 * 1024; // 64 MiB of f32
    let big = float_tensor(vec![n], &vec![0.5; n], candle_core::DType::F32);
    forward(&mut worker, &big, false);
    let big_times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            forward(&mut worker, &big, false);
            t.elapsed()
        })
        .collect();

    let (transport, as_checked, fresh, big_t) = (
        median(transport),
        median(as_checked),
        median(fresh),
        median(big_times),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "golden worker benchmark (medians; python {})",
        worker.info["python"]
    );
    println!(
        "  1k f32 identity, persistent worker, transport only:     {:>9.3} ms/case",
        ms(transport)
    );
    println!(
        "  1k f32 identity, persistent worker, as checks run it:   {:>9.3} ms/case",
        ms(as_checked)
    );
    println!(
        "  1k f32 identity, fresh interpreter per case:            {:>9.1} ms/case",
        ms(fresh)
    );
    println!(
        "  fresh / persistent (transport only):                    {:>9.0}x",
        ms(fresh) / ms(transport)
    );
    println!(
        "  fresh / persistent (as checks run it):                  {:>9.0}x",
        ms(fresh) / ms(as_checked)
    );
    let gb = 2.0 * (n * 4) as f64 / 1e9;
    println!(
        "  64 MiB f32 each way:                                    {:>9.1} ms, {:.2} GB/s (both directions counted)",
        ms(big_t),
        gb / big_t.as_secs_f64()
    );
}
