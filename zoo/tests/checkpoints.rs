//! Checkpoints (`weights = "..."`) as a whole model's: the quick form of `cargo xtask bench-scale`,
//! on the same code path. A tiny Llama checkpoint is made here with transformers' `save_pretrained`
//! (random init, tied embeddings: the file has `model.embed_tokens.weight` and no `lm_head.weight`)
//! and candle-transformers' Llama, unmodified, is checked against `transformers.LlamaForCausalLM`
//! on it (`scale_ref.LlamaLastLogits`: its logits at the last position, as candle's returns them).
//!
//! What they show: the checkpoint is mapped and hashed once per process, resolved through the
//! module's ties in both directions, loaded by the worker once and referred to by id (the golden
//! store holds no tensor of it); a checkpoint that does not fit the module fails before any case,
//! once, with the fix; a right port passes and a wrong one fails.

// A `Failure` carries the whole failing case; these helpers return it as the checks do.
#![allow(clippy::result_large_err)]

mod common;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::llama;
use common::Scratch;
use golden::internal::describe::env::Mode;
use golden::{DimExpr, Dist, Failure, FailureKind, Layer, Report};
use std::path::{Path, PathBuf};

const VOCAB: usize = 96;

/// A tiny Llama checkpoint made with `save_pretrained` in `dir` (`drop`: an entry left out).
fn make_checkpoint(dir: &Path, drop: Option<&str>) -> PathBuf {
    make_shape("tiny", dir, drop)
}

/// A checkpoint of `shape` (`reference_py/scale_ref/make_checkpoint.py`) in `dir`.
fn make_shape(shape: &str, dir: &Path, drop: Option<&str>) -> PathBuf {
    let options: Vec<&str> = drop.map_or(Vec::new(), |name| vec!["--drop", name]);
    make_with(shape, dir, &options)
}

/// A checkpoint of `shape` in `dir`, made with `make_checkpoint.py`'s `options` (`--dtype bf16`,
/// `--shard 20KB`, `--scale 30`, `--drop NAME`); the path of its `model.safetensors` (which a
/// sharded one does not have: its folder stands for it).
fn make_with(shape: &str, dir: &Path, options: &[&str]) -> PathBuf {
    let python = golden::internal::describe::env::python().program;
    let mut command = std::process::Command::new(python);
    command
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../reference_py"))
        .args(["-m", "scale_ref.make_checkpoint", shape])
        .arg(dir)
        .arg("0")
        .args(options);
    let out = command.output().expect("python runs");
    assert!(
        out.status.success(),
        "make_checkpoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("model.safetensors")
}

fn llama_layer(name: &str, weights: &Path, tied: bool) -> Layer {
    Layer::module(name, "scale_ref.LlamaLastLogits")
        .config("transformers.LlamaConfig")
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", 32)
        .config_value("intermediate_size", 64)
        .config_value("num_hidden_layers", 2)
        .config_value("num_attention_heads", 4)
        .config_value("num_key_value_heads", 2)
        .config_value("max_position_embeddings", 64)
        .config_value("rms_norm_eps", 1e-5)
        .config_value("rope_theta", 10_000.0)
        .config_value("tie_word_embeddings", tied)
        .weights(weights.to_str().unwrap())
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("t")],
            Dist::int(0, VOCAB as i64),
        )
        .cases(4)
        .timeout(180.0)
}

/// candle-transformers' Llama, unmodified, on the served checkpoint (`rope_theta`: the port's).
fn llama_port(
    rope_theta: f32,
) -> impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String> + Clone + Send + Sync + 'static
{
    move |inputs: &golden::PortInputs| {
        use golden::IntoOutputs;
        let config = llama::Config {
            hidden_size: 32,
            intermediate_size: 64,
            vocab_size: VOCAB,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            use_flash_attn: false,
            rms_norm_eps: 1e-5,
            rope_theta,
            bos_token_id: None,
            eos_token_id: None,
            rope_scaling: None,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
        };
        let logits = (|| -> candle_core::Result<Tensor> {
            let model = llama::Llama::load(inputs.var_builder(), &config)?;
            let mut cache = llama::Cache::new(false, DType::F32, &config, &Device::Cpu)?;
            model.forward(inputs.tensor(0), 0, &mut cache)
        })();
        logits.into_outputs()
    }
}

fn check(layer: &Layer, scratch: &Scratch, rope_theta: f32) -> Result<Report, Failure> {
    let layer = layer.clone().declared_at(scratch.declared);
    golden::check(&layer, &llama_port(rope_theta))
}

#[test]
fn a_tied_checkpoint_is_served_once_and_a_right_port_passes_live_and_in_replay() {
    let scratch = Scratch::new("k_llama_right");
    let weights = make_checkpoint(&scratch.dir.join("model"), None);
    let layer = llama_layer("k_llama_right", &weights, true);
    let report = check(&layer, &scratch, 10_000.0).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(snapshot.contains("params: weights from"), "{snapshot}");

    // Mapped and hashed once per process: a second open is the same checkpoint.
    let first = golden::internal::answers::checkpoint::open(&weights).unwrap();
    let again = golden::internal::answers::checkpoint::open(&weights).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    assert_eq!(first.hash_hex().len(), 32);

    // Recorded, the store holds no tensor of the checkpoint (it is smaller than the file), and a
    // replay reads the file and passes.
    let recorded = check(&layer.clone().mode(Mode::Record), &scratch, 10_000.0)
        .unwrap_or_else(|f| panic!("{f}"));
    drop(recorded);
    let store = scratch.store(&layer.clone().declared_at(scratch.declared));
    let stored = std::fs::metadata(&store).unwrap().len();
    let file = std::fs::metadata(&weights).unwrap().len();
    assert!(
        stored < file / 2,
        "the store ({stored} bytes) holds the checkpoint ({file} bytes)"
    );
    check(&layer.clone().mode(Mode::Replay), &scratch, 10_000.0)
        .unwrap_or_else(|f| panic!("the replay failed: {f}"));
}

#[test]
fn a_wrong_rope_theta_on_a_checkpoint_fails_on_the_logits() {
    let scratch = Scratch::new("k_llama_theta");
    let weights = make_checkpoint(&scratch.dir.join("model"), None);
    let layer = llama_layer("k_llama_theta", &weights, true);
    let failure = check(&layer, &scratch, 500_000.0).expect_err("a wrong rope_theta passed");
    let msg = failure.to_string();
    assert!(matches!(failure.kind, FailureKind::Case(_)), "{msg}");
    assert!(msg.contains("leaf `out`"), "{msg}");
    // A case outside assert_close's bound is judged with every stage of the reference's
    // evaluation: the float64 answer and the nudged ones, the whole rounding estimate.
    assert!(
        msg.contains("16 × rounding estimate (largest rounding estimate here"),
        "{msg}"
    );
}

/// Published checkpoints are bf16 and, past a few GB, sharded: `weights` names the index (or the
/// folder) and golden reads the shards through it; the reference evaluates the bf16 weights in
/// the case dtype (f32) as `from_pretrained(dtype=float32)` would, without a float32 copy of them,
/// and the port is served them converted once.
#[test]
fn a_sharded_bf16_checkpoint_is_read_through_its_index_live_and_in_replay() {
    let scratch = Scratch::new("k_llama_sharded");
    let dir = scratch.dir.join("model");
    make_with("tiny", &dir, &["--dtype", "bf16", "--shard", "20KB"]);
    let index = dir.join("model.safetensors.index.json");
    assert!(
        index.exists() && dir.join("model-00003-of-00003.safetensors").exists(),
        "save_pretrained did not shard the checkpoint"
    );
    let layer = llama_layer("k_llama_sharded", &index, true);
    let report = check(&layer, &scratch, 10_000.0).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("model.safetensors.index.json (a whole model"),
        "{snapshot}"
    );
    check(&layer.clone().mode(Mode::Record), &scratch, 10_000.0).unwrap_or_else(|f| panic!("{f}"));
    check(&layer.clone().mode(Mode::Replay), &scratch, 10_000.0)
        .unwrap_or_else(|f| panic!("the replay failed: {f}"));
    // The folder save_pretrained wrote names the same checkpoint.
    let by_folder = golden::internal::answers::checkpoint::open(&dir).unwrap();
    let by_index = golden::internal::answers::checkpoint::open(&index).unwrap();
    assert_eq!(by_folder.hash, by_index.hash);
    // A wrong port fails on it as on an f32 file.
    let failure = check(
        &llama_layer("k_llama_sharded_theta", &index, true),
        &scratch,
        500_000.0,
    )
    .expect_err("a wrong rope_theta passed on a sharded checkpoint");
    assert!(failure.to_string().contains("leaf `out`"), "{failure}");
}

/// The reference's evaluation of a whole model follows the margin: a case inside assert_close's
/// bound needs the case dtype's answer alone, one outside it gets the float64 answer and, if that
/// is not enough, the nudged ones; the snapshot says how many cases stopped where, the same live
/// and in replay. Logits a thousand times larger (the embedding scaled) make the reference's own
/// rounding exceed assert_close's absolute bound at small logits on some cases, so a right port
/// needs the rounding term there and not elsewhere.
#[test]
fn the_references_evaluations_follow_the_margin_and_the_snapshot_says_so() {
    let scratch = Scratch::new("k_llama_margin");
    let dir = scratch.dir.join("model");
    let weights = make_with("tiny", &dir, &["--scale", "1000"]);
    let layer = llama_layer("k_llama_margin", &weights, true).cases(8);
    let live = check(&layer, &scratch, 10_000.0).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = live.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("reference evaluations (a whole model's"),
        "{snapshot}"
    );
    assert!(
        snapshot.contains("the case dtype alone (assert_close's bound held)"),
        "{snapshot}"
    );
    assert!(snapshot.contains("with float64"), "{snapshot}");
    check(&layer.clone().mode(Mode::Record), &scratch, 10_000.0).unwrap_or_else(|f| panic!("{f}"));
    let replayed = check(&layer.clone().mode(Mode::Replay), &scratch, 10_000.0)
        .unwrap_or_else(|f| panic!("the replay failed: {f}"));
    // The block of the snapshot that says where the cases stopped.
    let line = |s: &str| {
        let mut block = s
            .lines()
            .skip_while(|l| !l.contains("reference evaluations"));
        let header = block.next().unwrap_or_default().to_string();
        let counts: Vec<&str> = block.take_while(|l| l.starts_with("    ")).collect();
        format!("{header}\n{}", counts.join("\n"))
    };
    assert_eq!(
        line(&replayed.snapshot().unwrap()),
        line(&snapshot),
        "the replay stopped its cases at other stages"
    );
}

#[test]
fn a_checkpoint_that_does_not_fit_fails_once_before_any_case_with_the_fix() {
    // The module unties its head: the file has no `lm_head.weight`.
    let scratch = Scratch::new("k_llama_untied");
    let weights = make_checkpoint(&scratch.dir.join("model"), None);
    let failure = check(
        &llama_layer("k_llama_untied", &weights, false),
        &scratch,
        10_000.0,
    )
    .expect_err("an untied module passed on a tied checkpoint");
    let msg = failure.to_string();
    assert!(matches!(failure.kind, FailureKind::Config(_)), "{msg}");
    assert!(msg.contains("has no `lm_head.weight`"), "{msg}");
    assert!(failure.case.is_none(), "{msg}");
    assert!(!msg.contains("shrunk"), "{msg}");

    // A file without either name of the tie: said once, with the tie and that nothing is needed.
    let scratch = Scratch::new("k_llama_no_embedding");
    let weights = make_checkpoint(
        &scratch.dir.join("model"),
        Some("model.embed_tokens.weight"),
    );
    let failure = check(
        &llama_layer("k_llama_no_embedding", &weights, true),
        &scratch,
        10_000.0,
    )
    .expect_err("a checkpoint without its embedding passed");
    let msg = failure.to_string();
    assert!(matches!(failure.kind, FailureKind::Config(_)), "{msg}");
    assert!(
        msg.contains("it is tied to `lm_head.weight` in the module")
            && msg.contains("nothing needs declaring for a tie"),
        "{msg}"
    );
    assert_eq!(
        msg.matches("has no `model.embed_tokens.weight`").count(),
        1,
        "said once: {msg}"
    );
}

/// candle-transformers' Llama given the input ids shifted by one (a tokenizer's off-by-one), with
/// the one point of a third-party model a port can tap from outside: the embedding, read from the
/// same VarBuilder (candle-transformers' blocks are private).
fn shifted_port(inputs: &golden::PortInputs) -> Result<golden::Outputs, String> {
    use golden::IntoOutputs;
    let config = llama::Config {
        hidden_size: 32,
        intermediate_size: 64,
        vocab_size: VOCAB,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
    };
    let logits = (|| -> candle_core::Result<Tensor> {
        let vb = inputs.var_builder();
        let ids = inputs.tensor(0);
        let plus_one: Vec<f32> = ids
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(|i| (i + 1.0) % VOCAB as f32)
            .collect();
        let shifted =
            Tensor::from_vec(plus_one, ids.shape(), &Device::Cpu)?.to_dtype(ids.dtype())?;
        let embedding = candle_nn::embedding(VOCAB, 32, vb.pp("model.embed_tokens"))?;
        golden::tap(
            "model.embed_tokens",
            &candle_core::Module::forward(&embedding, &shifted)?,
        );
        let model = llama::Llama::load(vb, &config)?;
        let mut cache = llama::Cache::new(false, DType::F32, &config, &Device::Cpu)?;
        model.forward(&shifted, 0, &mut cache)
    })();
    logits.into_outputs()
}

#[test]
fn a_traced_failure_on_a_checkpoint_stops_shrinking_at_a_stable_divergence_and_refers_to_the_file()
{
    let scratch = Scratch::new("k_llama_shifted");
    let weights = make_checkpoint(&scratch.dir.join("model"), None);
    let layer = llama_layer("k_llama_shifted", &weights, true)
        .trace()
        .declared_at(scratch.declared);
    let failure = golden::check(&layer, &shifted_port).expect_err("shifted input ids passed");
    let msg = failure.to_string();
    assert!(
        msg.lines()
            .next()
            .unwrap()
            .contains("at `model.embed_tokens`"),
        "{msg}"
    );
    // Every failing case diverges first at the embedding: shrinking stops after three in a row.
    assert!(
        msg.contains(
            "note: shrinking stopped once the first divergence held still: `model.embed_tokens` \
             on 3 failing cases in a row"
        ),
        "{msg}"
    );
    // The artifacts refer to the checkpoint (its path and hash) and copy none of its tensors.
    let dir = PathBuf::from(
        msg.lines()
            .find(|l| l.contains("/failures/"))
            .expect("the artifacts' folder")
            .trim(),
    );
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let file = golden::internal::answers::checkpoint::open(&weights).unwrap();
    assert_eq!(case["checkpoint"]["hash"], file.hash_hex(), "{case:#}");
    assert_eq!(
        case["checkpoint"]["path"],
        weights.display().to_string(),
        "{case:#}"
    );
    assert_eq!(
        case["checkpoint"]["entries"]["lm_head.weight"][0], "model.embed_tokens.weight",
        "{case:#}"
    );
    assert!(
        !dir.join("state_dict").exists(),
        "the state_dict was copied"
    );
    // repro.py reads the file and reproduces the failure.
    let python = golden::internal::describe::env::python().program;
    let out = std::process::Command::new(python)
        .arg(dir.join("repro.py"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("leaf `out`")
            && text.contains("reference run again gives exactly what the test saw"),
        "repro.py: {text}"
    );
}

#[test]
fn a_port_that_asks_whether_the_checkpoint_holds_a_tied_name_is_told_as_the_file_would() {
    // candle-transformers' Qwen2 reads `lm_head.weight` when the VarBuilder says it holds one and
    // the embedding otherwise; save_pretrained's file holds only `model.embed_tokens.weight`. Told
    // that the tied name is there, it read a weight no real checkpoint has and failed the check.
    use candle_transformers::models::qwen2;
    let scratch = Scratch::new("k_qwen2_tied");
    let weights = make_shape("tiny-qwen2", &scratch.dir.join("model"), None);
    let layer = Layer::module("k_qwen2_tied", "scale_ref.Qwen2LastLogits")
        .config("transformers.Qwen2Config")
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", 32)
        .config_value("intermediate_size", 64)
        .config_value("num_hidden_layers", 2)
        .config_value("num_attention_heads", 4)
        .config_value("num_key_value_heads", 2)
        .config_value("max_position_embeddings", 64)
        .config_value("rms_norm_eps", 1e-6)
        .config_value("rope_theta", 10_000.0)
        .config_value("tie_word_embeddings", true)
        .config_value("sliding_window", 64)
        .config_value("max_window_layers", 2)
        .config_value("use_sliding_window", false)
        .weights(weights.to_str().unwrap())
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("t")],
            Dist::int(0, VOCAB as i64),
        )
        .cases(3)
        .timeout(180.0)
        .declared_at(scratch.declared);
    let port = |inputs: &golden::PortInputs| -> Result<golden::Outputs, String> {
        use golden::IntoOutputs;
        let config = qwen2::Config {
            vocab_size: VOCAB,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 64,
            sliding_window: 64,
            max_window_layers: 2,
            tie_word_embeddings: true,
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-6,
            use_sliding_window: false,
            hidden_act: candle_nn::Activation::Silu,
        };
        qwen2::ModelForCausalLM::new(&config, inputs.var_builder())
            .and_then(|mut m| m.forward(inputs.tensor(0), 0))
            .into_outputs()
    };
    golden::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
}

/// A 4×4 linear layer's checkpoint (`proj.weight`, `proj.bias`), written with candle in `dir`;
/// `scale` makes checkpoints of different contents (a worker keeps a checkpoint's state by its
/// content: two files with the same bytes are one state).
fn linear_checkpoint(dir: &Path, scale: f64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("linear.safetensors");
    let device = Device::Cpu;
    let weight = Tensor::arange(0f32, 16.0, &device)
        .and_then(|t| t.reshape((4, 4)))
        .and_then(|t| t.affine(0.1 * scale, -0.7))
        .unwrap();
    let bias = Tensor::new(&[0.5f32, -1.0, 0.25, 2.0], &device).unwrap();
    let tensors = std::collections::HashMap::from([
        ("proj.weight".to_string(), weight),
        ("proj.bias".to_string(), bias),
    ]);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    path
}

/// `fault_ref.RewritesItsCheckpoint` on the checkpoint at `weights`, which its first forward
/// writes over as `how` says.
fn rewriting_layer(name: &str, weights: &Path, how: &str) -> Layer {
    let path = weights.to_str().unwrap();
    Layer::module(name, "fault_ref.RewritesItsCheckpoint")
        .init("path", path)
        .init("how", how)
        .weights(path)
        .dim("b", 1, 3)
        .dim("d", 4, 4)
        .arg("x", ["b", "d"], Dist::default())
        .cases(4)
        .mode(Mode::Live)
}

/// The right port of `rewriting_layer`: the linear layer on the served checkpoint.
fn linear_port(inputs: &golden::PortInputs) -> Result<golden::Outputs, String> {
    use candle_core::Module;
    use golden::IntoOutputs;
    candle_nn::linear(4, 4, inputs.var_builder().pp("proj"))
        .and_then(|l| l.forward(inputs.tensor(0)))
        .into_outputs()
}

/// A checkpoint written over while a check read it: the reference ran on zero-filled pages and the
/// port was blamed for it, or passed on them, and a checkpoint cut short killed the worker with
/// SIGBUS in a message that did not name it (#31 item 11). The check now stops, names the file and
/// what became of it, blames nothing on the port and saves no failing seed.
#[test]
fn a_checkpoint_written_over_during_a_check_is_named_and_the_port_not_blamed() {
    let scratch = Scratch::new("k_rewritten");
    let check = |name: &str, how: &str, scale: f64| {
        let weights = linear_checkpoint(&scratch.dir.join(name), scale);
        let layer = rewriting_layer(name, &weights, how).declared_at(scratch.declared);
        (golden::check(&layer, &linear_port), weights)
    };
    // The port is right on a checkpoint left alone.
    let (untouched, _) = check("k_untouched", "none", 1.0);
    untouched.unwrap_or_else(|f| panic!("{f}"));

    let (cut, weights) = check("k_truncated", "truncate", 3.0);
    let msg = cut
        .expect_err("a check on a truncated checkpoint must not pass")
        .to_string();
    assert!(
        msg.contains(&format!(
            "the checkpoint {} changed on disk while the check was reading it",
            weights.display()
        )) && msg.contains("truncated")
            && msg.contains("SIGBUS"),
        "{msg}"
    );
    let (zeroed, weights) = check("k_zeroed", "zeros", 2.0);
    let failure = zeroed.expect_err("a check on a checkpoint written over must not pass");
    let msg = failure.to_string();
    assert!(matches!(failure.kind, FailureKind::Worker(_)), "{msg}");
    assert!(
        msg.contains(&format!(
            "the checkpoint {} changed on disk while the check was reading it",
            weights.display()
        )) && msg.contains("rewritten"),
        "{msg}"
    );
    assert!(!msg.contains("does not match its reference"), "{msg}");

    // Neither is the port's: no failing case is saved for it to replay.
    let regressions = scratch.dir.join("proptest-regressions/check.txt");
    assert!(
        !regressions.exists(),
        "{}",
        std::fs::read_to_string(&regressions).unwrap_or_default()
    );
}
