//! A third-party port: candle-transformers' Whisper (`candle_transformers::models::whisper`)
//! against Hugging Face's (`transformers`, `reference_py/zoo_ref/whisper.py`), both on the same
//! random weights of a tiny config, the reference's state_dict served to candle through golden's
//! module form. candle's Whisper applies `Tensor::gelu` (the tanh approximation) where Hugging
//! Face's uses the exact erf GELU; golden must fail it and name that, with the line in the
//! Hugging Face source, from the reference's own torch calls (the reference declares no variants).
//! Live only: it needs transformers.

mod common;

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::whisper::{model::Whisper, Config};
use golden::internal::describe::env::Mode;
use golden::{DimExpr, Dist, Layer, PortInputs};

const D_MODEL: usize = 16;
const MELS: usize = 8;
const FRAMES: usize = 8;
const VOCAB: usize = 32;

fn whisper_layer(name: &str) -> Layer {
    Layer::module(name, "zoo_ref.whisper.TinyWhisper")
        .init("d_model", D_MODEL)
        .init("num_mel_bins", MELS)
        .init("max_source_positions", FRAMES)
        .init("max_target_positions", FRAMES)
        .init("vocab_size", VOCAB)
        .dim("b", 1, 2)
        .dim("t", 1, FRAMES)
        .arg(
            "mel",
            ["b".into(), DimExpr::Lit(MELS), DimExpr::Lit(2 * FRAMES)],
            Dist::default(),
        )
        .arg("tokens", ["b", "t"], Dist::int(0, VOCAB as i64))
        // A transformer's first request imports transformers: allow for it on a busy machine.
        .timeout(180.0)
}

/// candle-transformers' Whisper as it is: encoder, decoder, logits.
fn candle_whisper(vb: VarBuilder, mel: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let config = Config {
        num_mel_bins: MELS,
        max_source_positions: FRAMES,
        d_model: D_MODEL,
        encoder_attention_heads: 2,
        encoder_layers: 1,
        vocab_size: VOCAB,
        max_target_positions: FRAMES,
        decoder_attention_heads: 2,
        decoder_layers: 1,
        suppress_tokens: Vec::new(),
    };
    let mut model = Whisper::load(&vb, config)?;
    let audio = model.encoder.forward(mel, true)?;
    let hidden = model.decoder.forward(tokens, &audio, true)?;
    model.decoder.final_linear(&hidden)
}

#[test]
fn candle_whisper_uses_the_tanh_gelu_where_hugging_face_uses_erf() {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let layer = whisper_layer("hf_whisper").mode(Mode::Live);
    let failure = common::must_fail(&layer, |i: &PortInputs| {
        candle_whisper(i.var_builder(), i.tensor(0), i.tensor(1))
    });
    let msg = failure.to_string();
    let c = failure.case_failure().unwrap_or_else(|| panic!("{msg}"));
    assert!(
        c.params.is_empty(),
        "the weights must load as they are:\n{msg}"
    );
    let gelu = c
        .mutations
        .iter()
        .find(|m| m.mutation.what == "F.gelu(approximate='tanh')")
        .unwrap_or_else(|| panic!("the tanh GELU is not named:\n{msg}"));
    // Every GELU of Hugging Face's Whisper at once: the convolutions' in the encoder and the
    // layers' (through transformers' activation module), as candle uses the tanh one everywhere.
    assert!(
        gelu.mutation
            .site
            .contains("transformers/models/whisper/modeling_whisper.py:"),
        "{msg}"
    );
    assert!(
        gelu.mutation.site.contains("transformers/activations.py:"),
        "{msg}"
    );
    assert!(
        !gelu.mutation.site.contains("/root/") && !gelu.mutation.site.contains("site-packages"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with F.gelu(approximate='tanh')"
        ),
        "{msg}"
    );
    assert!(msg.contains("fix: use Tensor::gelu_erf"), "{msg}");
    // With --nocapture, the message as a user sees it.
    eprintln!("{msg}");
}
