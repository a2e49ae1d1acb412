//! Third-party ports through time: candle-transformers 0.11.1's cached models — Llama, Mistral,
//! Gemma and Qwen2, unmodified — against their transformers originals, driven through golden's
//! schedules (`decode`): the same random weights on both sides (a tiny config), every step's logits
//! against the reference's cached run and its one-shot forward. candle's models keep their KV cache
//! inside (Mistral, Gemma, Qwen2: `forward(input_ids, seqlen_offset)`) or in a `Cache` passed in
//! (Llama: `forward(x, index_pos, &mut cache)`) and return only the last position's logits, which
//! golden compares there and says so. Their `forward` takes no attention mask; Mistral's and Gemma's
//! `forward_embeds` take one built by the caller, and so are checked on padded batches too.
//!
//! What golden finds in them is asserted here and written in the book (docs/src/). Each check has a golden
//! store in `tests/golden/`, so the assertions hold in replay, with no Python.

// A `Failure` carries the whole failing case; these helpers return it as the checks do.
#![allow(clippy::result_large_err)]

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Activation, Module};
use candle_transformers::models::{gemma, llama, mistral, qwen2};
use common::{declared_with_store, Scratch};
use golden::{Decode, DimExpr, Dist, Failure, Layer, Report, Step};

const VOCAB: usize = 32;
const HIDDEN: usize = 16;
const INTERMEDIATE: usize = 24;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const POSITIONS: usize = 64;
const WINDOW: usize = 3;

/// A causal LM of transformers driven through schedules of up to 8 tokens.
fn causal_lm(name: &str, reference: &str, config: &str) -> Layer {
    Layer::module(name, reference)
        .config(config)
        .config_value("vocab_size", VOCAB)
        .config_value("hidden_size", HIDDEN)
        .config_value("intermediate_size", INTERMEDIATE)
        .config_value("num_hidden_layers", LAYERS)
        .config_value("num_attention_heads", HEADS)
        .config_value("num_key_value_heads", KV_HEADS)
        .config_value("max_position_embeddings", POSITIONS)
        .config_value("rms_norm_eps", 1e-6)
        .config_value("tie_word_embeddings", false)
        .dim("b", 1, 2)
        .dim("n", 2, 8)
        .arg(
            "input_ids",
            [DimExpr::from("b"), DimExpr::from("n")],
            Dist::int(0, VOCAB as i64),
        )
        .decode(Decode::over("input_ids"))
        .cases(12)
        // A transformer's first request imports transformers: allow for it on a busy machine.
        .timeout(180.0)
}

fn check(
    layer: &Layer,
    port: impl Fn(&golden::PortInputs) -> std::result::Result<golden::Outputs, String>
        + Clone
        + Send
        + Sync
        + 'static,
) -> std::result::Result<Report, Failure> {
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    golden::check(&layer, &port)
}

#[test]
fn candle_llama_passes_prefills_decode_steps_and_chunks() {
    let layer = causal_lm(
        "c_llama",
        "transformers.LlamaForCausalLM",
        "transformers.LlamaConfig",
    );
    let config = llama::Config {
        hidden_size: HIDDEN,
        intermediate_size: INTERMEDIATE,
        vocab_size: VOCAB,
        num_hidden_layers: LAYERS,
        num_attention_heads: HEADS,
        num_key_value_heads: KV_HEADS,
        use_flash_attn: false,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: POSITIONS,
        tie_word_embeddings: false,
    };
    // The cache is a value passed in and out of `forward`: the stepper holds both.
    let port = common::stepping(
        "logits",
        move |vb| {
            let model = llama::Llama::load(vb, &config)?;
            let cache = llama::Cache::new(true, DType::F32, &config, &Device::Cpu)?;
            Ok((model, cache))
        },
        |(model, cache): &mut (llama::Llama, llama::Cache), step: &Step| {
            model.forward(step.input("input_ids")?, step.offset(), cache)
        },
    );
    let report = check(&layer, port).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(snapshot.contains("chunked prefills"), "{snapshot}");
}

fn mistral_config() -> mistral::Config {
    mistral::Config {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: INTERMEDIATE,
        num_hidden_layers: LAYERS,
        num_attention_heads: HEADS,
        head_dim: None,
        num_key_value_heads: KV_HEADS,
        hidden_act: Activation::Silu,
        max_position_embeddings: POSITIONS,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        sliding_window: Some(WINDOW),
        use_flash_attn: false,
    }
}

#[test]
fn candle_mistral_does_not_apply_its_sliding_window_to_the_cache() {
    let layer = causal_lm(
        "c_mistral",
        "transformers.MistralForCausalLM",
        "transformers.MistralConfig",
    )
    .config_value("sliding_window", WINDOW);
    let port = common::stepping(
        "logits",
        |vb| mistral::Model::new(&mistral_config(), vb),
        |model: &mut mistral::Model, step: &Step| {
            model.forward(step.input("input_ids")?, step.offset())
        },
    );
    let msg = match check(&layer, port) {
        Ok(_) => panic!("candle-transformers' Mistral passed"),
        Err(f) => f.to_string(),
    };
    println!("{msg}");
    // candle masks a chunk of several tokens with `j + w < i` inside the chunk only (every cached
    // key visible, the window one key wider there) and a one-token step not at all, and never
    // trims its cache: once a step is past the window it sees keys that transformers' does not.
    assert!(
        msg.contains("leaves its reference `transformers.MistralForCausalLM` at step"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with the schedule driven with a \
             sliding window that is not applied to the cached keys"
        ),
        "{msg}"
    );
    assert!(msg.contains("on both failing cases"), "{msg}");
}

/// The additive mask of a step for candle-transformers' `forward_embeds`, `[b, 1, t, offset + t]`,
/// built as transformers builds its own: query i (an index of the whole sequence, padding counted)
/// sees key j when j ≤ i, j > i − w within a sliding window w, and j is not padding
/// (`step.attention_mask()`); elsewhere f32's minimum — finite, as transformers' masks are: a
/// padded query whose every key is masked averages them instead of making NaNs that would reach
/// the valid rows through the next layer's values. `padding: false` is the leaking port's mask:
/// causal (and windowed) only.
fn step_mask(step: &Step, window: Option<usize>, padding: bool) -> candle_core::Result<Tensor> {
    let (offset, t) = (step.offset(), step.len());
    let ids = step.input("input_ids")?;
    let batch = ids.dim(0)?;
    let valid: Vec<Vec<u8>> = match (step.attention_mask(), padding) {
        (Some(mask), true) => mask.to_vec2::<u8>()?,
        _ => vec![vec![1; offset + t]; batch],
    };
    let values: Vec<f32> = valid
        .iter()
        .flat_map(|row| {
            (offset..offset + t).flat_map(move |i| {
                (0..offset + t).map(move |j| {
                    let seen = j <= i && window.is_none_or(|w| j + w > i) && row[j] == 1;
                    if seen {
                        0.0
                    } else {
                        f32::MIN
                    }
                })
            })
        })
        .collect();
    Tensor::from_vec(values, (batch, 1, t, offset + t), ids.device())
}

fn padded(layer: Layer) -> Layer {
    let decode = layer.decoding().expect("a schedule").clone();
    layer.decode(Decode {
        padding: true,
        ..decode
    })
}

/// candle-transformers' Mistral through `forward_embeds`, given the mask a padded batch needs
/// (`padding: false`: the causal and windowed mask without the padding — a port that leaks it).
/// Its rotary positions are the offset's (`seqlen_offset`), padding counted, where transformers
/// counts a row's valid tokens: rotary attention depends on positions' differences only, so the
/// two agree within rounding.
fn mistral_padded_port(
    padding: bool,
) -> impl Fn(&golden::PortInputs) -> std::result::Result<golden::Outputs, String>
       + Clone
       + Send
       + Sync
       + 'static {
    let step: fn(&mut mistral::Model, &Step) -> candle_core::Result<Tensor> = if padding {
        |model: &mut mistral::Model, step: &Step| {
            let xs = model.embed_tokens().forward(step.input("input_ids")?)?;
            let mask = step_mask(step, Some(WINDOW), true)?;
            model.forward_embeds(&xs, Some(&mask), step.offset())
        }
    } else {
        |model: &mut mistral::Model, step: &Step| {
            let xs = model.embed_tokens().forward(step.input("input_ids")?)?;
            let mask = step_mask(step, Some(WINDOW), false)?;
            model.forward_embeds(&xs, Some(&mask), step.offset())
        }
    };
    common::stepping(
        "logits",
        |vb| mistral::Model::new(&mistral_config(), vb),
        step,
    )
}

fn mistral_padded(name: &str) -> Layer {
    padded(causal_lm(
        name,
        "transformers.MistralForCausalLM",
        "transformers.MistralConfig",
    ))
    .config_value("sliding_window", WINDOW)
}

#[test]
fn candle_mistral_given_the_padding_mask_passes_padded_batches() {
    let layer = mistral_padded("c_mistral_padded");
    let report = check(&layer, mistral_padded_port(true)).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    // Rows of a single token, whose prefill can end on padding: where the last position's logits
    // that candle returns are padding, on both sides.
    assert!(snapshot.contains(", one-token "), "{snapshot}");
}

#[test]
fn candle_mistral_attending_to_padded_keys_fails_on_the_padding() {
    let layer = mistral_padded("c_mistral_padding_leaks");
    let msg = match check(&layer, mistral_padded_port(false)) {
        Ok(_) => panic!("a Mistral attending to padded keys passed"),
        Err(f) => f.to_string(),
    };
    println!("{msg}");
    // candle's rotary positions are the offset's: without the padding mask the padded tokens are
    // tokens, positions and all — named so, with the fix that candle's API allows.
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with the schedule driven with the \
             padding treated as tokens: no padding mask, and position ids counting the padding"
        ),
        "{msg}"
    );
    assert!(msg.contains("on both failing cases"), "{msg}");
    assert!(
        msg.contains("candle-transformers' Mistral and Gemma take one through `forward_embeds`"),
        "{msg}"
    );
}

/// candle-transformers' Gemma through `forward_embeds` with the padding mask (its LM head is its
/// embedding, as `tie_word_embeddings` makes transformers' one).
#[test]
fn candle_gemma_given_the_padding_mask_passes_padded_batches() {
    let layer = padded(causal_lm(
        "c_gemma_padded",
        "transformers.GemmaForCausalLM",
        "transformers.GemmaConfig",
    ))
    .config_value("head_dim", HIDDEN / HEADS)
    .config_value("tie_word_embeddings", true);
    let config = gemma::Config {
        attention_bias: false,
        head_dim: HIDDEN / HEADS,
        hidden_act: Some(Activation::GeluPytorchTanh),
        hidden_activation: None,
        hidden_size: HIDDEN,
        intermediate_size: INTERMEDIATE,
        num_attention_heads: HEADS,
        num_hidden_layers: LAYERS,
        num_key_value_heads: KV_HEADS,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        vocab_size: VOCAB,
        max_position_embeddings: POSITIONS,
    };
    let port = common::stepping(
        "logits",
        move |vb| gemma::Model::new(false, &config, vb),
        |model: &mut gemma::Model, step: &Step| {
            let xs = model.embed_tokens().forward(step.input("input_ids")?)?;
            let mask = step_mask(step, None, true)?;
            model.forward_embeds(&xs, Some(&mask), step.offset())
        },
    );
    let report = check(&layer, port).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    // Right padding: a short row's last position is padding.
    assert!(snapshot.contains(", right "), "{snapshot}");
}

#[test]
fn candle_qwen2_passes_every_step() {
    let layer = causal_lm(
        "c_qwen2",
        "transformers.Qwen2ForCausalLM",
        "transformers.Qwen2Config",
    );
    let config = qwen2::Config {
        vocab_size: VOCAB,
        hidden_size: HIDDEN,
        intermediate_size: INTERMEDIATE,
        num_hidden_layers: LAYERS,
        num_attention_heads: HEADS,
        num_key_value_heads: KV_HEADS,
        max_position_embeddings: POSITIONS,
        sliding_window: POSITIONS,
        max_window_layers: LAYERS,
        tie_word_embeddings: false,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        use_sliding_window: false,
        hidden_act: Activation::Silu,
    };
    let port = common::stepping(
        "logits",
        move |vb| qwen2::ModelForCausalLM::new(&config, vb),
        |model: &mut qwen2::ModelForCausalLM, step: &Step| {
            model.forward(step.input("input_ids")?, step.offset())
        },
    );
    let report = check(&layer, port).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("note: the port returns only the last position"),
        "{snapshot}"
    );
}
