//! `cargo xtask bench-scale`'s golden side: one whole-model check of candle-transformers' model on
//! a checkpoint, in one process, as a porter's `cargo test` runs it (release build).
//!
//! ```text
//! golden_check SHAPE CHECKPOINT MODE DIR [CASES] [TOKENS]
//! ```
//!
//! MODE is `live`, `record` or `replay`; DIR holds the check's golden store. Prints one line,
//! `wall_s=.. peak_self=.. peak_worker=.. verdict=.. worst_ratio=..`, and the snapshot or the
//! failure on stderr.

#[path = "models.rs"]
mod models;

use golden::internal::describe::env::Mode;
use golden::{DimExpr, Dist, IntoOutputs, Layer};
use models::{peak_rss, Model, Shape};
use std::time::Instant;

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "golden_check SHAPE CHECKPOINT live|record|replay|fail DIR [CASES] [TOKENS]";
    let shape = Shape::parse(args.get(1).expect(usage)).expect(usage);
    let checkpoint = args.get(2).expect(usage).clone();
    // `fail`: live, traced, with a wrong port (the input ids shifted by one): a trace failure.
    let wrong = args.get(3).map(String::as_str) == Some("fail");
    let mode = match args.get(3).map(String::as_str) {
        Some("live" | "fail") => Mode::Live,
        Some("record") => Mode::Record,
        Some("replay") => Mode::Replay,
        _ => panic!("{usage}"),
    };
    let dir = std::path::PathBuf::from(args.get(4).expect(usage));
    let cases: u32 = args.get(5).map_or(4, |c| c.parse().expect(usage));
    let tokens: usize = args.get(6).map_or(32, |t| t.parse().expect(usage));
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("bench_scale_{}", args[1].replace(['.', '-'], "_"));
    let declared = golden::Declared {
        source_file: leak(dir.join("check.rs").display().to_string()),
        module_path: leak(format!("bench_scale::{name}")),
        snapshot_dir: leak(dir.display().to_string()),
        ..golden::declared!()
    };
    let mut layer = Layer::module(&name, shape.reference()).config(shape.config_class());
    for (key, value) in shape.config_values() {
        layer = layer.config_value(key, value);
    }
    let layer = layer
        .weights(&checkpoint)
        .dim("b", 1, 1)
        .dim("t", tokens, tokens)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("t")],
            Dist::int(0, shape.vocab() as i64),
        )
        .cases(cases)
        .timeout(1200.0)
        .mode(mode)
        .declared_at(declared);
    let layer = if wrong { layer.trace() } else { layer };
    let port = move |inputs: &golden::PortInputs| {
        let ids = if wrong {
            match models::shifted_with_embedding_tap(shape, inputs.var_builder(), inputs.tensor(0))
            {
                Ok(ids) => ids,
                Err(e) => return Err(e.to_string()),
            }
        } else {
            inputs.tensor(0).clone()
        };
        Model::load(shape, inputs.var_builder())
            .and_then(|mut m| m.last_logits(&ids))
            .into_outputs()
    };
    let started = Instant::now();
    let result = golden::check(&layer, &port);
    let wall = started.elapsed().as_secs_f64();
    let peak_worker = golden::internal::python::worker::pool()
        .idle_pids()
        .iter()
        .filter_map(|p| peak_rss(&p.to_string()))
        .max()
        .unwrap_or(0);
    let peak_self = peak_rss("self").unwrap_or(0);
    let (verdict, worst) = match &result {
        Ok(report) => {
            let worst = report
                .runs
                .iter()
                .flat_map(|r| &r.cases)
                .flat_map(|c| &c.leaves)
                .filter_map(|l| match &l.verdict {
                    golden::internal::judge::compare::Verdict::Values(v) => Some(v.worst_ratio),
                    _ => None,
                })
                .fold(0.0f64, f64::max);
            eprintln!("{}", report.snapshot().unwrap_or_default());
            ("pass", worst)
        }
        Err(f) => {
            eprintln!("{f}");
            ("fail", f64::NAN)
        }
    };
    // A failure's artifacts: their folder is the message's line under target/golden/failures.
    let artifacts = result
        .as_ref()
        .err()
        .and_then(|f| {
            f.to_string()
                .lines()
                .find(|l| l.contains("/failures/"))
                .map(|l| models::bytes_under(std::path::Path::new(l.trim())))
        })
        .unwrap_or(0);
    println!(
        "wall_s={wall:.2} peak_self={peak_self} peak_worker={peak_worker} verdict={verdict} \
         worst_ratio={worst:.3} artifacts_bytes={artifacts}"
    );
}
