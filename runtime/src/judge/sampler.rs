//! A port's sampler against the reference's draws: exactly, where it takes golden's uniforms, and
//! in distribution, where it draws its own random numbers (`judge/distribution.rs`). What differs
//! becomes a [`SamplerFinding`]: the logits vector it showed on, the draws or the counts that
//! differ, and — once the diagnosis has run — the smallest logits vector that shows it and the
//! likely cause.

use crate::describe::numbers::num;
use crate::judge::distribution::{self, Fit};
use std::fmt;

/// How far from a boundary of the cumulative distribution a uniform may fall and still flip to
/// the neighbouring token between two right samplers: their probabilities agree to rounding
/// (float32 softmax, float64 sums), a few units of 1e-7 summed over a vocabulary.
pub const FLIP: f64 = 1e-5;

/// A logits vector a sampler was checked on.
#[derive(Clone, Debug, PartialEq)]
pub struct Vector {
    /// What it is: `the logits of generated token 1 of row 0`, `golden's probe (whole numbers,
    /// ties)`.
    pub what: String,
    /// The logits, as the sampler got them.
    pub logits: Vec<f32>,
    /// The row's tokens so far.
    pub previous: Vec<u32>,
}

/// What a sampler drew that the reference does not.
#[derive(Clone, Debug, PartialEq)]
pub enum Evidence {
    /// Draws with golden's uniforms: the first that differs, and how many do.
    Exact {
        /// The uniform of the first draw that differs.
        uniform: f64,
        /// The reference's token there.
        expected: u32,
        /// The sampler's.
        drawn: u32,
        /// How many draws differ, of how many.
        differ: usize,
        /// Of.
        of: usize,
        /// The reference's probabilities.
        probs: Vec<f64>,
    },
    /// Draws with the sampler's own random numbers: the test's verdict.
    Distribution(Fit),
}

/// A sampler's draws that are not the reference's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerFinding {
    /// The vector it showed on.
    pub vector: Vector,
    /// What differs.
    pub evidence: Evidence,
    /// The smallest logits vector that still shows it (the diagnosis' shrinking), as printed.
    pub smallest: Option<String>,
    /// The likely causes: mistakes of a sampler under which the reference draws as the port does,
    /// each `what — fix: ...`.
    pub causes: Vec<String>,
    /// What the diagnosis could not do (replay, a port that failed), as printed.
    pub notes: Vec<String>,
    /// The draws it showed on: their uniforms (exact) and the sampler's tokens.
    pub draws: (Vec<f64>, Vec<u32>),
}

impl SamplerFinding {
    /// A finding without diagnosis yet.
    pub fn new(vector: Vector, evidence: Evidence) -> Self {
        SamplerFinding {
            vector,
            evidence,
            smallest: None,
            causes: Vec::new(),
            notes: Vec::new(),
            draws: (Vec::new(), Vec::new()),
        }
    }
}

/// `[0.5, 1, -inf]`, at most `max` values.
pub fn values(v: &[f32], max: usize) -> String {
    let shown: Vec<String> = v.iter().take(max).map(|x| num(f64::from(*x))).collect();
    let more = if v.len() > max {
        format!(", ... ({} values)", v.len())
    } else {
        String::new()
    };
    format!("[{}{more}]", shown.join(", "))
}

/// The probabilities of the tokens that have some, `token 3: 0.25, token 7: 0.75`.
pub fn support(probs: &[f64], max: usize) -> String {
    let kept: Vec<String> = probs
        .iter()
        .enumerate()
        .filter(|(_, p)| **p > 0.0)
        .take(max)
        .map(|(i, p)| format!("token {i}: {}", num(*p)))
        .collect();
    let n = probs.iter().filter(|p| **p > 0.0).count();
    if n > max {
        format!("{}, ... ({n} tokens)", kept.join(", "))
    } else {
        kept.join(", ")
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::Exact {
                uniform,
                expected,
                drawn,
                differ,
                of,
                probs,
            } => {
                let p = |t: u32| probs.get(t as usize).copied().unwrap_or(0.0);
                let cannot = if p(*drawn) <= 0.0 {
                    " — a token transformers cannot draw there (probability 0 after its \
                     processors)"
                } else {
                    ""
                };
                write!(
                    f,
                    "with golden's uniform u = {}, the sampler draws token {drawn} where \
                     transformers' draws token {expected} ({differ} of {of} draws differ); \
                     transformers' probabilities: token {expected} {}, token {drawn} {}{cannot} \
                     ({})",
                    num(*uniform),
                    num(p(*expected)),
                    num(p(*drawn)),
                    support(probs, 8)
                )
            }
            Evidence::Distribution(fit) => {
                let mut parts = Vec::new();
                if !fit.impossible.is_empty() {
                    let tokens: Vec<String> = fit
                        .impossible
                        .iter()
                        .take(6)
                        .map(|(t, c)| format!("token {t} {c} times"))
                        .collect();
                    parts.push(format!(
                        "it draws tokens transformers cannot draw (probability 0 after its \
                         processors): {}",
                        tokens.join(", ")
                    ));
                }
                if fit.p_value < distribution::FALSE_ALARM {
                    let cells: Vec<String> = fit
                        .differing(4)
                        .into_iter()
                        .map(|c| {
                            format!(
                                "{} drawn {} times where {} were expected",
                                c.name(),
                                c.observed,
                                num(c.expected)
                            )
                        })
                        .collect();
                    parts.push(format!(
                        "its frequencies are not transformers' probabilities (chi-square {} on {} \
                         degrees of freedom, p = {} < the test's false-alarm rate {}): {}",
                        num(fit.statistic),
                        fit.df,
                        num(fit.p_value),
                        num(distribution::FALSE_ALARM),
                        cells.join("; ")
                    ));
                }
                write!(
                    f,
                    "in distribution, over {} draws with its own random numbers, {}",
                    fit.draws,
                    parts.join("; and ")
                )
            }
        }
    }
}

impl fmt::Display for SamplerFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the sampler does not draw as transformers does on {} (logits {}, previous tokens \
             {:?}): {}",
            self.vector.what,
            values(&self.vector.logits, 8),
            self.vector.previous,
            self.evidence
        )?;
        if let Some(smallest) = &self.smallest {
            write!(
                f,
                "\n      the smallest logits vector that shows it: {smallest}"
            )?;
        }
        for cause in &self.causes {
            write!(f, "\n      likely cause: {cause}")?;
        }
        for note in &self.notes {
            write!(f, "\n      note: {note}")?;
        }
        Ok(())
    }
}

/// Whether a draw of `drawn` where the reference drew `expected` with uniform `u` is a flip
/// across a boundary of the cumulative distribution within rounding ([`FLIP`]): the two tokens are
/// neighbours among those that can be drawn, and `u` is that close to the boundary between them.
pub fn is_flip(probs: &[f64], u: f64, expected: u32, drawn: u32) -> bool {
    let total: f64 = probs.iter().sum();
    let (lo, hi) = (expected.min(drawn) as usize, expected.max(drawn) as usize);
    if hi >= probs.len() || probs[lo] <= 0.0 || probs[hi] <= 0.0 {
        return false;
    }
    if probs[lo + 1..hi].iter().any(|p| *p > 0.0) {
        return false;
    }
    let boundary: f64 = probs[..=lo].iter().sum::<f64>() / total;
    (u - boundary).abs() < FLIP
}

/// The draws of `drawn` (with uniforms `u`) against the reference's `expected`: the first that
/// differs beyond a flip within rounding, and how many do.
pub fn exact(probs: &[f64], u: &[f64], expected: &[u32], drawn: &[u32]) -> Option<(usize, usize)> {
    let differ: Vec<usize> = (0..expected.len().min(drawn.len()))
        .filter(|&i| expected[i] != drawn[i] && !is_flip(probs, u[i], expected[i], drawn[i]))
        .collect();
    differ.first().map(|&i| (i, differ.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_near_a_boundary_is_a_flip_and_elsewhere_a_difference() {
        let probs = [0.25, 0.0, 0.5, 0.25];
        // The boundary between tokens 0 and 2 is at 0.25 (token 1 cannot be drawn).
        assert!(is_flip(&probs, 0.25 + 1e-7, 0, 2));
        assert!(!is_flip(&probs, 0.3, 0, 2));
        assert!(!is_flip(&probs, 0.25, 0, 3));
        assert_eq!(
            exact(&probs, &[0.1, 0.6, 0.9], &[0, 2, 3], &[0, 2, 3]),
            None
        );
        assert_eq!(
            exact(&probs, &[0.1, 0.6, 0.9], &[0, 2, 3], &[0, 3, 1]),
            Some((1, 2))
        );
    }

    #[test]
    fn a_finding_names_the_draw_the_tokens_and_what_cannot_be_drawn() {
        let finding = SamplerFinding::new(
            Vector {
                what: "golden's probe".into(),
                logits: vec![1.0, 0.0, 2.0],
                previous: vec![1],
            },
            Evidence::Exact {
                uniform: 0.5,
                expected: 2,
                drawn: 1,
                differ: 3,
                of: 16,
                probs: vec![0.3, 0.0, 0.7],
            },
        );
        let text = finding.to_string();
        assert!(
            text.contains("the sampler draws token 1 where transformers' draws token 2 (3 of 16 draws differ)"),
            "{text}"
        );
        assert!(
            text.contains("a token transformers cannot draw there"),
            "{text}"
        );
    }
}
