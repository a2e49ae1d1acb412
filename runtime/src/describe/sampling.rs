//! Sampling that matches: what `decode(generate = N, sample(...))` declares, the random numbers
//! golden gives both sides, and the port's side of a draw ([`Draw`]; the `Sampler` trait is beside
//! `Stepper`, in `run/steps.rs`).
//!
//! transformers' `generate(do_sample=True)` processes the logits of each generated token with its
//! logits processors, in its own fixed order (repetition penalty, then temperature, top-k, top-p,
//! min-p), and draws with `torch.multinomial`, whose random numbers nothing outside torch
//! reproduces. golden makes the draw reproducible instead: for row `b` and generated token `j` it
//! draws a uniform `u[b][j]` in [0, 1) from the case seed ([`uniforms`]), and the reference's draw
//! (`torch.multinomial`, replaced while `generate()` runs: `golden_ref/sampling.py`) takes *the
//! first token, in vocabulary order, whose cumulative probability exceeds `u · Σp`* — the inverse
//! of the cumulative distribution of the probabilities `generate()` computed. A port's sampler
//! that takes `u` ([`Draw::uniform`]) and draws the same way draws the same tokens: it is checked
//! exactly. One that draws its own random numbers (candle-transformers' `LogitsProcessor`) is
//! checked in distribution (`judge/distribution.rs`).

use crate::describe::rng::Rng;
use serde_json::{json, Value as Json};
use std::cell::Cell;
use std::fmt;

/// What `sample(...)` declares: the sampling parameters of `generate()`, each optional (not
/// declared: not applied, whatever `generate()` would default to — its `top_k = 50` included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    /// Logits divided by it.
    pub temperature: Option<f64>,
    /// Only the `k` most likely tokens (and every token tied with the k-th).
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose mass reaches `p` (the token that crosses `p` kept).
    pub top_p: Option<f64>,
    /// Only the tokens at least `min_p` times as likely as the most likely one.
    pub min_p: Option<f64>,
    /// The logit of every token already in the row (prompt and generated) divided by it where
    /// positive, multiplied where negative.
    pub repetition_penalty: Option<f64>,
}

impl Sampling {
    /// No processing at all: a draw from the softmax of the logits.
    pub fn new() -> Self {
        Sampling::default()
    }

    /// With `temperature`.
    pub fn temperature(mut self, t: f64) -> Self {
        self.temperature = Some(t);
        self
    }

    /// With `top_k`.
    pub fn top_k(mut self, k: usize) -> Self {
        self.top_k = Some(k);
        self
    }

    /// With `top_p`.
    pub fn top_p(mut self, p: f64) -> Self {
        self.top_p = Some(p);
        self
    }

    /// With `min_p`.
    pub fn min_p(mut self, p: f64) -> Self {
        self.min_p = Some(p);
        self
    }

    /// With `repetition_penalty`.
    pub fn repetition_penalty(mut self, penalty: f64) -> Self {
        self.repetition_penalty = Some(penalty);
        self
    }

    /// As the worker reads it (`golden_ref/sampling.py`'s `spec`).
    pub(crate) fn to_json(&self) -> Json {
        json!({
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        })
    }

    /// Parameters `generate()` refuses or that make no draw, named.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: Option<f64>| match v {
            Some(v) if !(v.is_finite() && v > 0.0) => Err(format!(
                "`sample({name} = {v})`: {name} must be a positive finite number"
            )),
            _ => Ok(()),
        };
        positive("temperature", self.temperature)?;
        positive("repetition_penalty", self.repetition_penalty)?;
        if self.top_k == Some(0) {
            return Err(
                "`sample(top_k = 0)`: top_k keeps at least one token (leave it out for \
                        no top-k)"
                    .into(),
            );
        }
        for (name, v) in [("top_p", self.top_p), ("min_p", self.min_p)] {
            if let Some(v) = v {
                if !(0.0..=1.0).contains(&v) || v == 0.0 && name == "top_p" {
                    return Err(format!(
                        "`sample({name} = {v})`: {name} is a probability in (0, 1]"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Which of the processors are applied, in transformers' order.
    pub fn processors(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.repetition_penalty.is_some_and(|r| r != 1.0) {
            out.push("repetition penalty");
        }
        if self.temperature.is_some_and(|t| t != 1.0) {
            out.push("temperature");
        }
        if self.top_k.is_some() {
            out.push("top-k");
        }
        if self.top_p.is_some_and(|p| p < 1.0) {
            out.push("top-p");
        }
        if self.min_p.is_some() {
            out.push("min-p");
        }
        out
    }
}

impl fmt::Display for Sampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(r) = self.repetition_penalty {
            parts.push(format!("repetition penalty {r}"));
        }
        if let Some(t) = self.temperature {
            parts.push(format!("temperature {t}"));
        }
        if let Some(k) = self.top_k {
            parts.push(format!("top-k {k}"));
        }
        if let Some(p) = self.top_p {
            parts.push(format!("top-p {p}"));
        }
        if let Some(p) = self.min_p {
            parts.push(format!("min-p {p}"));
        }
        if parts.is_empty() {
            f.write_str("sampled from the softmax")
        } else {
            write!(f, "sampled with {}", parts.join(", "))
        }
    }
}

/// golden's uniforms for `rows` rows of `count` draws each (row-major), in [0, 1): the draws both
/// sides take, from the case seed.
pub fn uniforms(seed: u64, rows: usize, count: usize) -> Vec<f64> {
    let mut rng = Rng::new(seed, "golden.sampling");
    (0..rows * count).map(|_| rng.unit()).collect()
}

/// How many draws golden makes on its probe per case: a logits vector of whole numbers that the
/// worker draws from the case seed (`golden_ref.sampling.probe`), so that ties are everywhere —
/// at the k-th token of top-k, at the cut of top-p, at the top — where a model's logits have none.
/// A sampler is checked on it as on the model's logits.
pub const PROBE_DRAWS: usize = 16;

/// golden's uniforms for the probe's draws.
pub fn probe_uniforms(seed: u64) -> Vec<f64> {
    fresh_uniforms(seed, "golden.sampling.probe", PROBE_DRAWS)
}

/// Fresh uniforms for a distribution test's draws (a sampler that takes golden's numbers is given
/// these; one that draws its own ignores them).
pub fn fresh_uniforms(seed: u64, stream: &str, count: usize) -> Vec<f64> {
    let mut rng = Rng::new(seed, stream);
    (0..count).map(|_| rng.unit()).collect()
}

/// A porting mistake in a sampler, made in the reference's processors or draw
/// (`golden_ref/sampling.py`'s `MISTAKES`): the diagnosis of a sampler that draws otherwise than
/// transformers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplerMistake {
    /// The temperature applied after the truncating processors.
    TemperatureLast,
    /// Top-p dropping the token whose cumulative mass crosses p.
    TopPDropsCrossing,
    /// Top-p keeping one token more than the one that crosses p.
    TopPKeepsOneMore,
    /// Top-p after top-k on the probabilities of the whole vocabulary, not renormalised.
    TopPUnrenormalised,
    /// Top-k keeping exactly k tokens, ties broken by the lower index.
    TopKTiesByIndex,
    /// The draw taken over the tokens sorted by probability.
    SortedDraw,
    /// The draw on truncated probabilities that are not renormalised.
    Unnormalised,
    /// No draw: the most likely token every time.
    Greedy,
    /// The repetition penalty dividing negative logits too.
    PenaltyDividesAll,
    /// One processor not applied.
    Skipped(&'static str),
}

impl SamplerMistake {
    /// Every mistake golden tries, most specific first.
    pub const ALL: [SamplerMistake; 14] = [
        SamplerMistake::Greedy,
        SamplerMistake::TemperatureLast,
        SamplerMistake::TopPDropsCrossing,
        SamplerMistake::TopPKeepsOneMore,
        SamplerMistake::TopPUnrenormalised,
        SamplerMistake::TopKTiesByIndex,
        SamplerMistake::SortedDraw,
        SamplerMistake::Unnormalised,
        SamplerMistake::PenaltyDividesAll,
        SamplerMistake::Skipped("repetition-penalty"),
        SamplerMistake::Skipped("temperature"),
        SamplerMistake::Skipped("top-k"),
        SamplerMistake::Skipped("top-p"),
        SamplerMistake::Skipped("min-p"),
    ];

    /// Its name for the worker.
    pub fn token(self) -> String {
        match self {
            SamplerMistake::TemperatureLast => "temperature-last".into(),
            SamplerMistake::TopPDropsCrossing => "top-p-drops-crossing".into(),
            SamplerMistake::TopPKeepsOneMore => "top-p-keeps-one-more".into(),
            SamplerMistake::TopPUnrenormalised => "top-p-unrenormalised".into(),
            SamplerMistake::TopKTiesByIndex => "top-k-ties-by-index".into(),
            SamplerMistake::SortedDraw => "sorted-draw".into(),
            SamplerMistake::Unnormalised => "unnormalised".into(),
            SamplerMistake::Greedy => "greedy".into(),
            SamplerMistake::PenaltyDividesAll => "penalty-divides-all".into(),
            SamplerMistake::Skipped(p) => format!("skip-{p}"),
        }
    }

    /// Whether the mistake changes anything under `sampling` (its processor is there).
    pub fn applies(self, sampling: &Sampling) -> bool {
        let on = sampling.processors();
        let truncating = on.iter().any(|p| matches!(*p, "top-k" | "top-p" | "min-p"));
        match self {
            SamplerMistake::TemperatureLast => on.contains(&"temperature") && truncating,
            SamplerMistake::TopPDropsCrossing | SamplerMistake::TopPKeepsOneMore => {
                on.contains(&"top-p")
            }
            SamplerMistake::TopPUnrenormalised => on.contains(&"top-p") && on.contains(&"top-k"),
            SamplerMistake::TopKTiesByIndex => on.contains(&"top-k"),
            SamplerMistake::Unnormalised => truncating,
            SamplerMistake::PenaltyDividesAll => on.contains(&"repetition penalty"),
            SamplerMistake::Skipped(p) => on.contains(&if p == "repetition-penalty" {
                "repetition penalty"
            } else {
                p
            }),
            SamplerMistake::SortedDraw | SamplerMistake::Greedy => true,
        }
    }

    /// Whether the mistake changes which tokens are drawn but not how often (a draw that only a
    /// sampler taking golden's uniforms can show).
    pub fn same_distribution(self) -> bool {
        self == SamplerMistake::SortedDraw
    }

    /// What the mistaken sampler does, what transformers does instead, and the fix.
    pub fn explain(self) -> (String, String, String) {
        let (what, instead, fix) = match self {
            SamplerMistake::TemperatureLast => (
                "the temperature applied after top-k/top-p/min-p (the truncation computed on \
                 untempered probabilities)",
                "the temperature first, then the truncating processors on the tempered logits",
                "divide the logits by the temperature before top-k, top-p and min-p (transformers' \
                 order: repetition penalty, temperature, top-k, top-p, min-p)",
            ),
            SamplerMistake::TopPDropsCrossing => (
                "top-p dropping the token whose cumulative probability crosses p",
                "the smallest set of most likely tokens whose mass reaches p: the token that \
                 crosses p is kept",
                "keep a token while the mass of the tokens before it is below p (`before < p`, \
                 not `before + p_i <= p`)",
            ),
            SamplerMistake::TopPKeepsOneMore => (
                "top-p keeping one token past the one that crosses p",
                "the tokens up to the one that crosses p, and no more",
                "cut after the token that crosses p: keep a token while the mass before it is \
                 below p (an off-by-one in the cut's index)",
            ),
            SamplerMistake::TopPUnrenormalised => (
                "top-p after top-k measured on the probabilities of the whole vocabulary, not \
                 renormalised over the k tokens kept",
                "top-p on the softmax of the scores top-k left (renormalised over the kept tokens)",
                "take top-p's cumulative mass from the softmax of the top-k-filtered logits \
                 (candle-transformers' `Sampling::TopKThenTopP` sums the full vocabulary's \
                 probabilities)",
            ),
            SamplerMistake::TopKTiesByIndex => (
                "top-k keeping exactly k tokens, ties with the k-th broken by index",
                "every token whose logit equals the k-th largest kept (`scores < kth` removed)",
                "keep every token whose logit is at least the k-th largest value, ties included \
                 (a partial sort that stops at k, `select_nth_unstable`, drops some of them)",
            ),
            SamplerMistake::SortedDraw => (
                "the draw taken over the tokens sorted by probability",
                "golden's draw: the first token in vocabulary order whose cumulative probability \
                 exceeds u · Σp",
                "take `u` (`draw.uniform()`) against the cumulative sum of the probabilities in \
                 vocabulary order (index 0 first), not sorted by probability",
            ),
            SamplerMistake::Unnormalised => (
                "a draw on truncated probabilities that were not renormalised (their sum below 1)",
                "the draw from the softmax of the processed logits (truncated tokens at -inf, the \
                 rest renormalised)",
                "renormalise after truncating (softmax of the processed logits, or divide by the \
                 kept mass) before drawing; compare u with u · Σp",
            ),
            SamplerMistake::Greedy => (
                "the same token every time: the most likely token, no draw",
                "a draw from the processed probabilities",
                "draw a token (inverse CDF of `draw.uniform()`, or a weighted random choice) \
                 instead of taking the argmax",
            ),
            SamplerMistake::PenaltyDividesAll => (
                "the repetition penalty dividing negative logits too (which makes repeated tokens \
                 with a negative logit more likely)",
                "positive logits divided by the penalty, negative ones multiplied",
                "`if logit < 0 { logit * penalty } else { logit / penalty }` for each token in \
                 `draw.previous()`",
            ),
            SamplerMistake::Skipped(p) => {
                return (
                    format!("the {} not applied", p.replace('-', " ")),
                    format!("the {} applied in transformers' order", p.replace('-', " ")),
                    format!(
                        "apply the {} (transformers' order: repetition penalty, temperature, \
                         top-k, top-p, min-p)",
                        p.replace('-', " ")
                    ),
                );
            }
        };
        (what.into(), instead.into(), fix.into())
    }
}

/// A job of draws for a port's sampler: one logits vector, the row's tokens so far, and one
/// uniform per draw.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DrawJob {
    /// The logits.
    pub(crate) logits: Vec<f32>,
    /// The row's tokens so far.
    pub(crate) previous: Vec<u32>,
    /// One per draw.
    pub(crate) uniforms: Vec<f64>,
}

/// One draw asked of a port's sampler: a row's logits of a generated token, the row's tokens so
/// far and golden's uniform for it.
pub struct Draw {
    logits: candle_core::Tensor,
    previous: Vec<u32>,
    uniform: f64,
    read: Cell<bool>,
}

impl Draw {
    /// A draw of `logits` (`[vocab]`) after `previous`, golden's uniform `uniform`.
    pub fn new(logits: candle_core::Tensor, previous: Vec<u32>, uniform: f64) -> Self {
        Draw {
            logits,
            previous,
            uniform,
            read: Cell::new(false),
        }
    }

    /// The row's logits, `[vocab]` f32, as the model returned them (before any processor).
    pub fn logits(&self) -> &candle_core::Tensor {
        &self.logits
    }

    /// The row's tokens so far: its prompt's (padding left out) and those generated before this
    /// one — the tokens the repetition penalty applies to.
    pub fn previous(&self) -> &[u32] {
        &self.previous
    }

    /// golden's uniform for this draw, in [0, 1): a sampler that takes it and returns the first
    /// token, in vocabulary order, whose cumulative probability exceeds `u · Σp` draws what the
    /// reference draws, and is checked exactly. A sampler that never calls this draws its own
    /// random numbers and is checked in distribution.
    pub fn uniform(&self) -> f64 {
        self.read.set(true);
        self.uniform
    }

    /// Whether the sampler took golden's uniform.
    pub(crate) fn took_uniform(&self) -> bool {
        self.read.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_and_probes_follow_the_seed_alone() {
        assert_eq!(uniforms(7, 2, 3), uniforms(7, 2, 3));
        assert_ne!(uniforms(7, 2, 3), uniforms(8, 2, 3));
        assert!(uniforms(7, 4, 50).iter().all(|u| (0.0..1.0).contains(u)));
        assert_eq!(probe_uniforms(3).len(), PROBE_DRAWS);
        assert_ne!(probe_uniforms(3), probe_uniforms(4));
    }

    #[test]
    fn parameters_are_validated_and_listed_in_transformers_order() {
        let s = Sampling::new()
            .min_p(0.05)
            .top_p(0.9)
            .top_k(8)
            .temperature(0.7)
            .repetition_penalty(1.3);
        assert_eq!(
            s.processors(),
            vec![
                "repetition penalty",
                "temperature",
                "top-k",
                "top-p",
                "min-p"
            ]
        );
        assert!(s.validate().is_ok());
        assert!(Sampling::new().temperature(0.0).validate().is_err());
        assert!(Sampling::new().top_p(1.5).validate().is_err());
        assert!(Sampling::new().top_k(0).validate().is_err());
        assert!(SamplerMistake::Skipped("top-k").applies(&s));
        assert!(!SamplerMistake::Skipped("top-k").applies(&Sampling::new().top_p(0.5)));
        assert!(!SamplerMistake::TemperatureLast.applies(&Sampling::new().temperature(0.5)));
        let draw = Draw::new(
            candle_core::Tensor::new(&[0f32, 1.0], &candle_core::Device::Cpu).unwrap(),
            vec![1],
            0.25,
        );
        assert!(!draw.took_uniform());
        assert_eq!(draw.uniform(), 0.25);
        assert!(draw.took_uniform());
    }
}
