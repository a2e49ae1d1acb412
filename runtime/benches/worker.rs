//! Worker figures, printed (not asserted): `cargo bench -p golden --bench worker`.
//!
//! * per-case round trip of a 1k-element f32 identity reference (`torch.clone`) through the
//!   persistent worker — transport only, and as checks use it (with the float64 and four nudged
//!   evaluations) — beside spawning a fresh interpreter per case (start-up, `import torch`, one call);
//! * tensor transport from 1 KiB to 256 MiB each way (the worker's `echo`), inline in the pipe and
//!   through shared memory, beside a pipe (`dd | dd`) and `memcpy` measured in the same run;
//! * the 64 MiB round trip of the identity reference as checks send it;
//! * the peak resident memory of both processes for a 64 MiB round trip, above what they held before;
//! * a check's cases on 1, 2 and 4 workers at once (the pool's `GOLDEN_WORKERS`), one test thread
//!   per worker as `cargo test` runs checks: cases per second and the speed-up over one worker;
//! * the peak resident memory of a whole check of a 64 MiB output, test process and worker, on
//!   each path: a passing check (float64 and nudged evaluations, the rounding estimate), a failing
//!   one (the case asked for again, shrinking, the diagnosis), each in a fresh process.
//!   `GOLDEN_BENCH_MEMORY=all` runs only this section.
//!
//! All figures come from one run on one machine, so their ratios are what to read.
//! `GOLDEN_BENCH_QUICK=1` stops the transport table at 16 MiB.

use golden::internal::describe::inputs::float_tensor;
use golden::internal::python::key::WorkerKey;
use golden::internal::python::shm;
use golden::internal::python::wire::TensorTable;
use golden::internal::python::worker::Worker;
use golden_files::{HostTensor, WireDType};
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

/// The worker sends `x` back as it came: transport and nothing else.
fn echo(worker: &mut Worker, x: &HostTensor) {
    let (_, tensors) = worker
        .request(
            json!({"op": "echo"}),
            vec![x.clone()],
            Duration::from_secs(600),
            "echoing",
        )
        .expect("the worker echoes");
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

fn time(n: usize, mut f: impl FnMut()) -> Duration {
    median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e9 / d.as_secs_f64()
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// A tensor of `bytes` bytes of f32, its values not all equal.
fn tensor(bytes: usize) -> HostTensor {
    let n = bytes / 4;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    HostTensor {
        dtype: WireDType::F32,
        shape: vec![n],
        data: data.into(),
    }
}

/// `dd if=/dev/zero bs=1M count=<MiB> | dd of=/dev/null bs=1M`: a pipe between two processes.
fn pipe_baseline(mib: usize) -> Option<Duration> {
    let script = format!(
        "dd if=/dev/zero bs=1M count={mib} status=none | dd of=/dev/null bs=1M status=none"
    );
    let runs: Vec<Duration> = (0..3)
        .filter_map(|_| {
            let t = Instant::now();
            let ok = std::process::Command::new("sh")
                .args(["-c", &script])
                .status()
                .ok()?
                .success();
            ok.then(|| t.elapsed())
        })
        .collect();
    (!runs.is_empty()).then(|| median(runs))
}

/// A `memcpy` of `bytes` between two buffers already touched.
fn memcpy_baseline(bytes: usize) -> Duration {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    time(5, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
    })
}

/// Kilobytes from a `/proc/<pid>/status` line.
fn status_kb(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident memory (kB) of process `pid` (`self` for this one).
fn rss(pid: &str) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// The peak resident memory of this process and of a fresh worker (bytes, above what each held
/// before: the worker warm, `x` already made) over one `f`; `min` as in
/// [`Worker::set_shared_memory`]. The peaks are reset first (`clear_refs` 5).
fn peaks(
    key: &WorkerKey,
    min: Option<usize>,
    x: &HostTensor,
    f: fn(&mut Worker, &HostTensor),
) -> Option<(u64, u64)> {
    let mut worker = Worker::spawn(key).expect("a worker starts");
    load(&mut worker);
    worker.set_shared_memory(min);
    let warm = tensor(64 << 10);
    echo(&mut worker, &warm);
    forward(&mut worker, &warm, false);
    let pid = worker.pid().to_string();
    let mut before = Vec::new();
    for p in ["self", pid.as_str()] {
        std::fs::write(format!("/proc/{p}/clear_refs"), "5").ok()?;
        before.push(rss(p)?);
    }
    f(&mut worker, x);
    let mine = status_kb("self", "VmHWM:")?.saturating_sub(before[0]);
    let its = status_kb(&pid, "VmHWM:")?.saturating_sub(before[1]);
    Some((mine * 1024, its * 1024))
}

/// Cases per second of `threads` checks at once, each on its own worker (what the pool gives as
/// many test threads), each running `cases` forward cases of `x` as checks run them.
fn throughput(key: &WorkerKey, threads: usize, cases: usize, x: &HostTensor) -> f64 {
    let mut workers: Vec<Worker> = (0..threads)
        .map(|_| {
            let mut w = Worker::spawn(key).expect("a worker starts");
            load(&mut w);
            for _ in 0..10 {
                forward(&mut w, x, true);
            }
            w
        })
        .collect();
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in workers.iter_mut() {
            s.spawn(move || {
                for _ in 0..cases {
                    forward(w, x, true);
                }
            });
        }
    });
    (threads * cases) as f64 / started.elapsed().as_secs_f64()
}

/// The peak resident memory of this process and of the pool's workers (bytes, above what each held
/// before, warm) over one whole `golden::check` of `layer` with `port`; `None` where the peaks
/// cannot be reset (`/proc/<pid>/clear_refs` not writable).
fn check_peak(layer: &golden::Layer, port: &golden::Port<'_>) -> Option<(u64, u64, bool)> {
    let workers = golden::internal::python::worker::pool().idle_pids();
    let mut before = Vec::new();
    for p in std::iter::once("self".to_string()).chain(workers.iter().map(u32::to_string)) {
        std::fs::write(format!("/proc/{p}/clear_refs"), "5").ok()?;
        before.push((p.clone(), rss(&p)?));
    }
    let passed = golden::check(layer, port).is_ok();
    let mine = status_kb("self", "VmHWM:")?.saturating_sub(before[0].1);
    let theirs = before[1..]
        .iter()
        .filter_map(|(p, b)| Some(status_kb(p, "VmHWM:")?.saturating_sub(*b)))
        .max()
        .unwrap_or(0);
    Some((mine * 1024, theirs * 1024, passed))
}

/// The layer and ports of the memory section: `torch.clone` of `n` f32 elements, right and wrong.
fn memory_layer(name: &str, n: usize) -> golden::Layer {
    golden::Layer::function(name, "torch.clone")
        .dim("n", n, n)
        .arg("x", ["n"], golden::Dist::default())
        .cases(2)
        .mode(golden::internal::describe::env::Mode::Live)
}

/// The paths of the memory section: (name, whether the port is right).
const MEMORY_PATHS: [(&str, bool); 2] = [
    ("passing (2 cases)", true),
    ("failing (asked again, shrinking, diagnosis)", false),
];

/// One path of the memory section, in this process (fresh: one worker, warmed on a small case):
/// prints `<test process peak> <worker peak>` in payloads.
fn memory_path(n: usize, right: bool) {
    use golden::{IntoOutputs, PortInputs};
    std::env::set_var("GOLDEN_WORKERS", "1");
    let port = move |i: &PortInputs| {
        if right {
            i.tensor(0).clone().into_outputs()
        } else {
            (i.tensor(0) * 2.0).into_outputs()
        }
    };
    let _ = golden::check(&memory_layer("warm", 1024), &port);
    let payload = (n * 4) as f64;
    match check_peak(&memory_layer("bench_memory", n), &port) {
        Some((mine, worker, _)) => {
            println!("{} {}", mine as f64 / payload, worker as f64 / payload)
        }
        None => println!("none"),
    }
}

/// Peak memory of a check's every path, for an output of `n` f32 elements, each path in a fresh
/// process of this benchmark (see the module doc).
fn check_memory(n: usize) {
    println!(
        "\n  peak RSS of a whole check of a {} f32 output (torch.clone), each path in a fresh test \
         process and worker, above what each held warm, in payloads:",
        size_name(n * 4)
    );
    let exe = std::env::current_exe().expect("this benchmark's path");
    for (i, (path, _)) in MEMORY_PATHS.iter().enumerate() {
        let out = std::process::Command::new(&exe)
            .env("GOLDEN_BENCH_MEMORY", i.to_string())
            .env("GOLDEN_BENCH_MEMORY_N", n.to_string())
            .stderr(std::process::Stdio::null())
            .output()
            .expect("the benchmark runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let figures: Vec<f64> = text
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        match figures[..] {
            [mine, worker] => {
                println!("    {path:<44} test process {mine:>5.1}x, worker {worker:>5.1}x")
            }
            _ => println!(
                "    {path:<44} (peak RSS not measurable here: {})",
                text.trim()
            ),
        }
    }
}

fn main() {
    let key = WorkerKey::from_env(Some(env!("CARGO_MANIFEST_DIR")));
    let quick = std::env::var_os("GOLDEN_BENCH_QUICK").is_some();
    // `GOLDEN_BENCH_MEMORY=1`: only the memory section; `=<index>` (with `_N`): one of its paths,
    // in this (fresh) process.
    if let Ok(which) = std::env::var("GOLDEN_BENCH_MEMORY") {
        let n = std::env::var("GOLDEN_BENCH_MEMORY_N")
            .ok()
            .and_then(|n| n.parse().ok());
        match (which.parse::<usize>().ok(), n) {
            (Some(i), Some(n)) if i < MEMORY_PATHS.len() => memory_path(n, MEMORY_PATHS[i].1),
            _ => check_memory(16 * 1024 * 1024),
        }
        return;
    }
    let values: Vec<f64> = (0..1024).map(|i| i as f64 / 1024.0).collect();
    let small = float_tensor(vec![1024], &values, candle_core::DType::F32);

    let mut worker = Worker::spawn(&key).expect("a worker starts");
    let shm_min = worker.shared_memory();
    load(&mut worker);
    for _ in 0..20 {
        forward(&mut worker, &small, false);
    }
    let transport = time(500, || forward(&mut worker, &small, false));
    let as_checked = time(200, || forward(&mut worker, &small, true));
    let fresh = time(5, || {
        let mut w = Worker::spawn(&key).expect("a worker starts");
        load(&mut w);
        forward(&mut w, &small, false);
    });

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
        ms(fresh) / ms(transport.max(as_checked))
    );

    // Checks at once, each on its own worker.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "\n  checks at once, each on its own worker (the pool's GOLDEN_WORKERS), {cores} cores:"
    );
    println!(
        "  {:>7} | {:>16} {:>9} | {:>16} {:>9}",
        "workers", "1k f32 cases/s", "speed-up", "256k f32 cases/s", "speed-up"
    );
    let medium_values: Vec<f64> = (0..1 << 18).map(|i| (i % 1000) as f64 / 1000.0).collect();
    let medium = float_tensor(vec![1 << 18], &medium_values, candle_core::DType::F32);
    let mut base = None;
    for n in [1, 2, 4] {
        let small_rate = throughput(&key, n, if quick { 100 } else { 400 }, &small);
        let medium_rate = throughput(&key, n, if quick { 4 } else { 16 }, &medium);
        let (s1, m1) = *base.get_or_insert((small_rate, medium_rate));
        println!(
            "  {n:>7} | {small_rate:>16.0} {:>8.2}x | {medium_rate:>16.1} {:>8.2}x",
            small_rate / s1,
            medium_rate / m1
        );
    }

    // Baselines, in this run.
    let pipe = pipe_baseline(1024).map(|d| gbps(1 << 30, d));
    let memcpy = gbps(64 << 20, memcpy_baseline(64 << 20));
    println!();
    match pipe {
        Some(p) => {
            println!("  pipe between two processes (dd | dd, 1 GiB):           {p:>9.2} GB/s")
        }
        None => println!("  pipe between two processes (dd | dd): dd did not run"),
    }
    println!("  memcpy, 64 MiB between touched buffers:                 {memcpy:>9.2} GB/s");

    match shm_min {
        Some(min) => println!(
            "\n  tensor transport, echo each way (GB/s count both directions; default: shared \
             memory from {} up)",
            size_name(min)
        ),
        None => println!(
            "\n  tensor transport, echo each way: shared memory is not available here, inline only"
        ),
    }
    println!(
        "  {:>8} | {:>10} {:>7} | {:>10} {:>7} | {:>7} | {:>8} | {:>9}",
        "size", "inline ms", "GB/s", "shm ms", "GB/s", "shm/in", "vs pipe", "vs memcpy"
    );
    let top = if quick { 16 << 20 } else { 256 << 20 };
    let mut bytes = 1 << 10;
    let mut bend = None;
    while bytes <= top {
        let x = tensor(bytes);
        let reps = ((256 << 20) / bytes).clamp(3, 200);
        worker.set_shared_memory(None);
        echo(&mut worker, &x);
        let inline = time(reps, || echo(&mut worker, &x));
        let shared = worker.set_shared_memory(Some(0)).then(|| {
            echo(&mut worker, &x);
            time(reps, || echo(&mut worker, &x))
        });
        let moved = 2 * bytes;
        let line = match shared {
            Some(s) => {
                if bend.is_none() && s < inline {
                    bend = Some(bytes);
                }
                format!(
                    "{:>10.3} {:>7.2} | {:>6.2}x | {:>7.2}x | {:>8.2}x",
                    ms(s),
                    gbps(moved, s),
                    ms(inline) / ms(s),
                    pipe.map_or(f64::NAN, |p| gbps(moved, s) / p),
                    gbps(moved, s) / memcpy
                )
            }
            None => format!(
                "         -       - |       - | {:>7.2}x | {:>8.2}x",
                pipe.map_or(f64::NAN, |p| gbps(moved, inline) / p),
                gbps(moved, inline) / memcpy
            ),
        };
        println!(
            "  {:>8} | {:>10.3} {:>7.2} | {line}",
            size_name(bytes),
            ms(inline),
            gbps(moved, inline)
        );
        bytes *= 4;
    }
    worker.set_shared_memory(shm_min);
    if let Some(b) = bend {
        println!(
            "  shared memory is faster from {} up (default threshold: {})",
            size_name(b),
            size_name(shm::DEFAULT_MIN)
        );
    }

    // The identity reference as checks send it, 64 MiB each way, and the memory it takes.
    let n = 16 * 1024 * 1024;
    let big = float_tensor(vec![n], &vec![0.5; n], candle_core::DType::F32);
    let payload = (n * 4) as f64;
    println!("\n  64 MiB f32 each way, torch.clone as checks call it (precise = false):");
    let modes: [(&str, Option<usize>); 2] = [("inline", None), ("shared memory", shm_min)];
    for (name, min) in modes {
        if name == "shared memory" && shm_min.is_none() {
            continue;
        }
        worker.set_shared_memory(min);
        forward(&mut worker, &big, false);
        let t = time(5, || forward(&mut worker, &big, false));
        let e = time(5, || echo(&mut worker, &big));
        println!(
            "    {name:<14} forward {:>7.1} ms ({:.2} GB/s), echo {:>7.1} ms ({:.2} GB/s)",
            ms(t),
            gbps(2 * n * 4, t),
            ms(e),
            gbps(2 * n * 4, e)
        );
        let checked = |w: &mut Worker, x: &HostTensor| forward(w, x, false);
        match (
            peaks(&key, min, &big, echo),
            peaks(&key, min, &big, checked),
        ) {
            (Some((me_e, it_e)), Some((me_f, it_f))) => println!(
                "    {:<14} peak RSS above a warm worker's, in payloads: echo: test process \
                 {:.1}x, worker {:.1}x; forward: test process {:.1}x, worker {:.1}x",
                "",
                me_e as f64 / payload,
                it_e as f64 / payload,
                me_f as f64 / payload,
                it_f as f64 / payload
            ),
            _ => println!("    (peak RSS: /proc/<pid>/clear_refs is not writable here)"),
        }
    }
    check_memory(n);
}
