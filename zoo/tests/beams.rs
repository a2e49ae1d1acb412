//! Beam search that matches: a tiny Llama's generation, `decode(generate = N, beams = k)`,
//! against transformers' `generate(num_beams=k, do_sample=False)` (`golden_ref/beams.py`), step
//! by step. The model is candle-transformers 0.11.1's Llama, unmodified; candle-transformers has no
//! beam search, so the beam steps are written here:
//!
//! - one written after transformers' (every beam's candidates ranked together, the best k kept,
//!   the finished hypotheses' scores divided by `generated ** length_penalty`): passes;
//! - wrong ones, each a porting mistake of a beam search: caught, the first step, row and beam
//!   that differ named, and the mistake named by the diagnosis (the words asserted).
//! - a model that gives every row of a batch the first row's logits: its steps match on one row,
//!   and the running beams (a batch of k rows) show it on their log-probabilities.
//!
//! golden feeds each running beam's whole sequence to a freshly built port (no cache to reorder:
//! the candle model is built per beam step), so the port needs no cache reordering.
//!
//! Each check has a golden store in `tests/golden/`, so the assertions hold in replay, with no
//! Python.

// A `Failure` carries the whole failing case; these helpers return it as the checks do.
#![allow(clippy::result_large_err)]

mod common;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::llama;
use common::{declared_with_store, tiny_llama, Scratch};
use golden::{Beam, BeamStep, Beamed, Beams, Decode, Failure, Layer, Report, Step};
use std::collections::BTreeMap;

const BEAMS: usize = 3;
const LENGTH_PENALTY: f64 = 1.5;

/// A tiny `LlamaForCausalLM` generating 3 tokens by beam search after a prompt of 2 to 5.
fn beamed_llama(name: &str) -> Layer {
    tiny_llama::layer(name)
        .decode(Decode {
            generate: 3,
            beams: Some(Beams::new(BEAMS).length_penalty(LENGTH_PENALTY)),
            ..Decode::over("input_ids")
        })
        .cases(3)
        // A transformer's first request imports transformers: allow for it on a busy machine.
        .timeout(180.0)
}

/// A porting mistake the test's beam step makes on purpose.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    None,
    NotCumulative,
    PenaltyPerToken,
    PenaltyMissing,
    PerBeamBest,
    /// Not the beam step: the model gives every row of a batch the first row's logits.
    FirstRowForAll,
}

/// A beam step written after transformers' beam search (no end-of-sequence token): every
/// running beam's score plus each of its candidates' log-probabilities, ranked together (ties: the
/// lower beam, then the lower token), the best k kept; at the last token, the finished
/// hypotheses' scores divided by `generated ** length_penalty`.
fn beam_step(flaw: Flaw, step: &BeamStep) -> candle_core::Result<Vec<Beam>> {
    let logprobs: Vec<Vec<f32>> = step.logprobs().to_vec2()?;
    let k = step.beams();
    let penalty = |n: usize| (n as f64).powf(step.length_penalty()) as f32;
    let mut candidates = Vec::new();
    for (from, row) in logprobs.iter().enumerate() {
        let base = if flaw == Flaw::NotCumulative {
            0.0
        } else {
            step.scores()[from]
        };
        let mut mine: Vec<Beam> = row
            .iter()
            .enumerate()
            .map(|(token, &lp)| {
                let mut score = base + lp;
                if flaw == Flaw::PenaltyPerToken {
                    score /= penalty(step.index() + 1);
                }
                Beam {
                    from,
                    token: token as u32,
                    score,
                }
            })
            .collect();
        if flaw == Flaw::PerBeamBest {
            mine.sort_by(|a, b| b.score.total_cmp(&a.score));
            mine.truncate(1);
        }
        candidates.extend(mine);
    }
    // A stable sort: equal scores keep the order of beam, then token.
    candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
    candidates.truncate(k);
    if step.is_last() && flaw != Flaw::PenaltyPerToken && flaw != Flaw::PenaltyMissing {
        for c in &mut candidates {
            c.score /= penalty(step.count());
        }
    }
    Ok(candidates)
}

/// The port: candle-transformers' Llama, its cache passed in and out, with the beam step `flaw`
/// makes.
fn port(
    flaw: Flaw,
) -> impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String> + Clone + Send + Sync + 'static
{
    move |inputs: &golden::PortInputs| {
        golden::drive(inputs, move |inputs| {
            let config = tiny_llama::config();
            let built = (|| -> candle_core::Result<_> {
                let model = llama::Llama::load(inputs.var_builder(), &config)?;
                let cache = llama::Cache::new(true, DType::F32, &config, &Device::Cpu)?;
                Ok((model, cache))
            })();
            let made = built.map(|(model, mut cache)| Beamed {
                model: move |step: &Step| -> candle_core::Result<BTreeMap<&'static str, Tensor>> {
                    let logits =
                        model.forward(step.input("input_ids")?, step.offset(), &mut cache)?;
                    let logits = match flaw {
                        Flaw::FirstRowForAll => {
                            logits.narrow(0, 0, 1)?.repeat((logits.dim(0)?, 1))?
                        }
                        _ => logits,
                    };
                    Ok([("logits", logits)].into())
                },
                search: move |step: &BeamStep| beam_step(flaw, step),
            });
            golden::IntoStepper::into_stepper(made)
        })
    }
}

fn check(layer: &Layer, flaw: Flaw) -> Result<Report, Failure> {
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    golden::check(&layer, &port(flaw))
}

#[test]
fn a_beam_search_written_after_transformers_keeps_its_beams_every_step() {
    let layer = beamed_llama("beamed_llama");
    let report = check(&layer, Flaw::None).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains(
            "the port's model gives transformers' log-probabilities to every candidate of every \
             running beam, and its beam step keeps transformers' beams"
        ),
        "{snapshot}"
    );
}

fn wrong(name: &str, flaw: Flaw, cause: &str) -> String {
    let layer = beamed_llama(name);
    let msg = match check(&layer, flaw) {
        Ok(_) => panic!("the wrong beam search `{name}` passed"),
        Err(f) => f.to_string(),
    };
    println!("{msg}");
    assert!(
        msg.contains("step by step, but its beam search does not keep transformers' beams"),
        "{msg}"
    );
    assert!(msg.contains("at generated token "), "{msg}");
    assert!(
        msg.contains(&format!(
            "likely cause: the port's beam search with {cause}"
        )),
        "{msg}"
    );
    msg
}

#[test]
fn scores_that_are_not_cumulative_are_caught_and_named() {
    let msg = wrong(
        "beamed_wrong_not_cumulative",
        Flaw::NotCumulative,
        "scores that are not cumulative",
    );
    // Caught at the first token: the k copies of the prompt, only beam 0 extended by transformers.
    assert!(msg.contains("at generated token 0 of row 0"), "{msg}");
}

#[test]
fn a_length_penalty_applied_per_token_is_caught_and_named() {
    let msg = wrong(
        "beamed_wrong_penalty_per_token",
        Flaw::PenaltyPerToken,
        "the length penalty applied at every token",
    );
    // The first token's divisor is 1: the second token's scores show it.
    assert!(msg.contains("at generated token 1 of row 0"), "{msg}");
}

#[test]
fn a_length_penalty_missing_is_caught_and_named() {
    let msg = wrong(
        "beamed_wrong_penalty_missing",
        Flaw::PenaltyMissing,
        "the length penalty missing from the finished hypotheses' scores",
    );
    // Only the last token's scores are length-penalised: shrinking keeps as few tokens as show it.
    assert!(
        msg.contains(" of row 0 (the last: the finished hypotheses, length-penalised)"),
        "{msg}"
    );
}

#[test]
fn each_beam_extended_by_its_own_best_token_is_caught_and_named() {
    wrong(
        "beamed_wrong_per_beam_best",
        Flaw::PerBeamBest,
        "each beam extended by its own best token only",
    );
}

#[test]
fn a_model_that_mixes_the_beams_rows_is_caught_on_their_log_probabilities() {
    let layer = beamed_llama("beamed_wrong_first_row_for_all");
    let msg = match check(&layer, Flaw::FirstRowForAll) {
        Ok(_) => panic!("a model giving every beam the first one's logits passed"),
        Err(f) => f.to_string(),
    };
    println!("{msg}");
    // Shrunk to one row, whose steps match: the beams, a batch of k rows, show it.
    assert!(
        msg.contains("step by step, but its beam search does not keep transformers' beams"),
        "{msg}"
    );
    assert!(
        msg.contains("the port's model gives candidate token "),
        "{msg}"
    );
    assert!(
        msg.contains("the model's output for one beam depends on the others in the batch"),
        "{msg}"
    );
}
