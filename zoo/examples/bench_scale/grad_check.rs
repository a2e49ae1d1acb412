//! `cargo xtask bench-scale`'s gradient check of a real decoder layer: golden's `grad` check of
//! the candle port of Hugging Face's Llama decoder layer (`decoder.rs`) at a real model's width,
//! against `llama_ref.DecoderLayer`, as a porter's `cargo test` runs it (release build).
//!
//! ```text
//! grad_check smollm2|qwen2.5 TOKENS [faithful|rms_norm|rope|softmax|silu_backward] [CASES]
//! ```
//!
//! The third argument swaps a step for candle's fused op without a backward, or for a SiLU with a
//! wrong backward (the check must fail, and name the op or locate the wrong entry). Prints one line, `wall_s=.. verdict=.. cases=..`, and the snapshot or the
//! failure on stderr.

#[path = "decoder.rs"]
mod decoder;

use decoder::{Dims, Variant};
use golden::{GradSpec, IntoOutputs};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "grad_check smollm2|qwen2.5 TOKENS [faithful|rms_norm|rope|softmax|silu_backward] [CASES]";
    let dims = match args.get(1).map(String::as_str) {
        Some("smollm2") => Dims::SMOLLM2,
        Some("qwen2.5") => Dims::QWEN25,
        _ => panic!("{usage}"),
    };
    let tokens: usize = args.get(2).and_then(|t| t.parse().ok()).expect(usage);
    let variant = Variant::parse(args.get(3).map_or("faithful", String::as_str)).expect(usage);
    let mut spec = GradSpec::default();
    if let Some(cases) = args.get(4) {
        spec.cases = cases.parse().expect(usage);
    }
    let name = format!("grad_{}_{}", args[1].replace('.', "_"), tokens);
    let layer = decoder::layer(&name, dims, tokens).grad(spec);
    let port = move |inputs: &golden::PortInputs| {
        decoder::decoder(inputs.var_builder(), inputs.tensor(0), dims, variant).into_outputs()
    };
    let started = Instant::now();
    let result = golden::internal::run::gradients::check(&layer, &port);
    let wall = started.elapsed().as_secs_f64();
    let (verdict, cases) = match &result {
        Ok(report) => {
            eprintln!("{}", report.snapshot().unwrap_or_default());
            ("pass", report.runs.iter().map(|r| r.cases.len()).sum())
        }
        Err(f) => {
            eprintln!("{f}");
            ("fail", 0)
        }
    };
    println!("wall_s={wall:.2} verdict={verdict} cases={cases}");
}
