//! `cargo xtask bench-scale`'s hand-written baseline, Rust side: what a porter writes without
//! golden. Reads the `.npy` files `reference_py/scale_ref/hand_dump.py` wrote (each case's input ids
//! and the reference's logits), loads the checkpoint the usual way
//! (`VarBuilder::from_mmaped_safetensors`), runs candle-transformers' model on each case and prints
//! max |Δ|.
//!
//! ```text
//! hand_compare SHAPE CHECKPOINT DUMPS
//! ```
//!
//! Prints one line, `wall_s=.. peak_self=.. max_abs=..`.

#[path = "models.rs"]
#[allow(dead_code)] // the golden side uses the rest
mod models;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use models::{peak_rss, Model, Shape};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let usage = "hand_compare SHAPE CHECKPOINT DUMPS";
    let shape = Shape::parse(args.get(1).expect(usage)).expect(usage);
    let dumps = std::path::PathBuf::from(args.get(3).expect(usage));
    let device = Device::Cpu;
    // SAFETY: the checkpoint is not modified while the program runs.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[args.get(2).expect(usage)], DType::F32, &device)?
    };
    let mut model = Model::load(shape, vb)?;
    let mut max_abs = 0.0f32;
    for k in 0.. {
        let ids = dumps.join(format!("case{k}_input_ids.npy"));
        if !ids.exists() {
            break;
        }
        let ids = Tensor::read_npy(ids)?.to_dtype(DType::U32)?;
        let expected = Tensor::read_npy(dumps.join(format!("case{k}_logits.npy")))?;
        let logits = model.last_logits(&ids)?.reshape(expected.shape())?;
        let diff = (logits - expected)?.abs()?.max_all()?.to_scalar::<f32>()?;
        println!("case {k}: max |Δ| = {diff:e}");
        max_abs = max_abs.max(diff);
    }
    println!(
        "wall_s={:.2} peak_self={} max_abs={max_abs:e}",
        started.elapsed().as_secs_f64(),
        peak_rss("self").unwrap_or(0)
    );
    Ok(())
}
