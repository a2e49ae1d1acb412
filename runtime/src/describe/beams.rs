//! Beam search through `decode(generate = N, beams = k)`: what it declares ([`Beams`]) and the
//! port's side of a beam step ([`BeamStep`], [`Beam`]; the `BeamSearch` trait is beside `Stepper`,
//! in `run/steps.rs`).
//!
//! transformers' `generate(num_beams=k, do_sample=False)` keeps k running beams per row. At each
//! generated token it adds each running beam's cumulative score to the log-probabilities of its
//! candidate tokens (the log-softmax of the model's logits), takes the best 2k of the k·vocab
//! candidates (so that k remain when some end), keeps the best k that did not end as the running
//! beams (best first), and moves those that ended into the finished hypotheses, their score divided
//! by `generated ** length_penalty`. With no end-of-sequence token (golden's check has none: a
//! model's configuration would end beams a port given only these parameters knows nothing of),
//! every beam ends at the last token: the k finished hypotheses are the top k candidates of that
//! step, length-penalised. The reference records every step (`golden_ref/beams.py`); the port's
//! model and beam step are checked against each step in turn (`run/beams.rs`).

use serde_json::{json, Value as Json};
use std::fmt;

/// What `beams = k` declares: transformers' beam-search parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Beams {
    /// How many running beams each row keeps (`num_beams`).
    pub beams: usize,
    /// The finished hypotheses' scores are divided by `generated ** length_penalty`
    /// (`length_penalty`, transformers' default 1.0).
    pub length_penalty: f64,
    /// `early_stopping` (transformers' default false); with no end-of-sequence token every beam
    /// ends at the last token, so it changes nothing golden checks.
    pub early_stopping: bool,
}

impl Beams {
    /// `k` beams, length penalty 1, no early stopping (transformers' defaults).
    pub fn new(k: usize) -> Self {
        Beams {
            beams: k,
            length_penalty: 1.0,
            early_stopping: false,
        }
    }

    /// With `length_penalty`.
    pub fn length_penalty(mut self, penalty: f64) -> Self {
        self.length_penalty = penalty;
        self
    }

    /// With `early_stopping`.
    pub fn early_stopping(mut self, early: bool) -> Self {
        self.early_stopping = early;
        self
    }

    /// As the worker reads it (`golden_ref/beams.py`'s `spec`).
    pub(crate) fn to_json(&self) -> Json {
        json!({
            "beams": self.beams,
            "length_penalty": self.length_penalty,
            "early_stopping": self.early_stopping,
        })
    }

    /// Parameters `generate()` refuses, named.
    pub fn validate(&self) -> Result<(), String> {
        if self.beams < 2 {
            return Err(format!(
                "`beams = {}`: beam search keeps at least 2 beams (1 is greedy decoding: leave \
                 `beams` out)",
                self.beams
            ));
        }
        if !self.length_penalty.is_finite() {
            return Err(format!(
                "`length_penalty = {}`: a finite number",
                self.length_penalty
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Beams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "beam search with {} beams, length penalty {}",
            self.beams, self.length_penalty
        )?;
        if self.early_stopping {
            f.write_str(", early stopping")?;
        }
        Ok(())
    }
}

/// One beam kept after a beam step: the running beam it extends, its new token, its score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Beam {
    /// The index of the running beam it extends, in `0..k`.
    pub from: usize,
    /// Its new token.
    pub token: u32,
    /// Its score: the cumulative log-probability of its generated tokens; at the last generated
    /// token, the finished hypothesis's score (divided by `generated ** length_penalty`).
    pub score: f32,
}

/// One step of beam search asked of a port's beam step: one row's k running beams, the
/// log-probabilities of every candidate token of each (the log-softmax of the model's logits, as
/// transformers computes them) and their cumulative scores. The port returns the k beams kept,
/// best first.
pub struct BeamStep {
    logprobs: candle_core::Tensor,
    scores: Vec<f32>,
    index: usize,
    count: usize,
    length_penalty: f64,
}

impl BeamStep {
    /// A beam step: `logprobs` `[k, vocab]` f32, the running beams' `scores`, generated token
    /// `index` of `count`, the declared `length_penalty`.
    pub fn new(
        logprobs: candle_core::Tensor,
        scores: Vec<f32>,
        index: usize,
        count: usize,
        length_penalty: f64,
    ) -> Self {
        BeamStep {
            logprobs,
            scores,
            index,
            count,
            length_penalty,
        }
    }

    /// The log-probabilities of every candidate token of each running beam, `[k, vocab]` f32.
    pub fn logprobs(&self) -> &candle_core::Tensor {
        &self.logprobs
    }

    /// The running beams' cumulative scores, `[k]`. Before the first generated token the k beams
    /// are copies of the prompt, and transformers scores them 0 for beam 0 and -1e9 for the others
    /// (so only one is extended): golden gives the same.
    pub fn scores(&self) -> &[f32] {
        &self.scores
    }

    /// How many beams are kept.
    pub fn beams(&self) -> usize {
        self.scores.len()
    }

    /// Which generated token this is, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many tokens are generated in all: at the last (`index() + 1 == count()`) every beam
    /// ends, and the beams returned are the finished hypotheses, their scores length-penalised.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether this is the last generated token.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The declared length penalty.
    pub fn length_penalty(&self) -> f64 {
        self.length_penalty
    }
}

/// One beam step asked of the port, from the reference's state: its running beams' tokens so far
/// (fed to the port's model, each from position 0: no cache to reorder), their scores and the
/// reference's log-probabilities (given to the port's beam step).
#[derive(Clone, Debug)]
pub(crate) struct BeamJob {
    /// The running beams' tokens, `[k][prompt + index]`.
    pub(crate) sequences: Vec<Vec<u32>>,
    /// Their cumulative scores.
    pub(crate) scores: Vec<f32>,
    /// The reference's log-probabilities of each beam's candidates, `[k][vocab]`.
    pub(crate) logprobs: Vec<Vec<f32>>,
    /// Which generated token.
    pub(crate) index: usize,
    /// How many in all.
    pub(crate) count: usize,
    /// The declared length penalty.
    pub(crate) length_penalty: f64,
}
