//! Beam selection as transformers does it, and the usual porting mistakes of a beam step, on given
//! log-probabilities: the diagnosis of a port whose beam step keeps other beams than the
//! reference's (`run/beams.rs`).

use crate::describe::beams::Beam;

/// A porting mistake in a beam step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeamMistake {
    /// Candidates ranked and scored by their own log-probability, the running beam's score not
    /// added.
    NotCumulative,
    /// The length penalty applied at every token (each step's candidates' scores divided by the
    /// length so far ** length_penalty), not only to the finished hypotheses.
    PenaltyPerToken,
    /// The finished hypotheses' scores not divided by `generated ** length_penalty`.
    PenaltyMissing,
    /// Each running beam extended by its own best token only: no competition across beams.
    PerBeamBest,
}

impl BeamMistake {
    /// Every mistake golden tries.
    pub const ALL: [BeamMistake; 4] = [
        BeamMistake::NotCumulative,
        BeamMistake::PenaltyPerToken,
        BeamMistake::PenaltyMissing,
        BeamMistake::PerBeamBest,
    ];

    /// What the mistake is, what transformers does instead, and the fix.
    pub fn explain(self) -> (&'static str, &'static str, &'static str) {
        match self {
            BeamMistake::NotCumulative => (
                "scores that are not cumulative: each candidate ranked by its own \
                 log-probability",
                "the running beam's score plus the candidate's log-probability",
                "add the beam's cumulative score to its candidates' log-probabilities before \
                 ranking them",
            ),
            BeamMistake::PenaltyPerToken => (
                "the length penalty applied at every token",
                "the penalty applied once, to the finished hypotheses' scores",
                "keep the running scores as plain cumulative log-probabilities; divide by \
                 `generated ** length_penalty` only when a beam ends",
            ),
            BeamMistake::PenaltyMissing => (
                "the length penalty missing from the finished hypotheses' scores",
                "the score divided by `generated ** length_penalty`",
                "divide a finished beam's score by `generated ** length_penalty`",
            ),
            BeamMistake::PerBeamBest => (
                "each beam extended by its own best token only",
                "the best k of all beams' candidates together (transformers ranks the k·vocab \
                 candidates as one list)",
                "rank every beam's candidates together and keep the best k, several from one \
                 beam if they are best",
            ),
        }
    }
}

/// The k beams kept after a step, best first: the running `scores` plus each beam's `logprobs`
/// ranked over all beams' candidates together (ties: the lower beam, then the lower token, first),
/// as transformers' beam search does with no end-of-sequence token, with `mistake` made (`None`:
/// transformers' own). At the last generated token (`index + 1 == count`) the scores are the
/// finished hypotheses', divided by `count ** length_penalty`.
pub fn select(
    logprobs: &[Vec<f32>],
    scores: &[f32],
    index: usize,
    count: usize,
    length_penalty: f64,
    mistake: Option<BeamMistake>,
) -> Vec<Beam> {
    let k = scores.len();
    let last = index + 1 == count;
    let per_token = mistake == Some(BeamMistake::PenaltyPerToken);
    let divisor = |n: usize| (n as f64).powf(length_penalty) as f32;
    let mut candidates: Vec<Beam> = Vec::new();
    for (b, row) in logprobs.iter().enumerate().take(k) {
        let base = if mistake == Some(BeamMistake::NotCumulative) {
            0.0
        } else {
            scores[b]
        };
        let mut row_candidates: Vec<Beam> = row
            .iter()
            .enumerate()
            .map(|(t, &lp)| {
                let mut score = base + lp;
                if per_token {
                    score /= divisor(index + 1);
                }
                Beam {
                    from: b,
                    token: t as u32,
                    score,
                }
            })
            .collect();
        if mistake == Some(BeamMistake::PerBeamBest) {
            row_candidates.sort_by(|x, y| y.score.total_cmp(&x.score).then(x.token.cmp(&y.token)));
            row_candidates.truncate(1);
        }
        candidates.extend(row_candidates);
    }
    candidates.sort_by(|x, y| {
        y.score
            .total_cmp(&x.score)
            .then(x.from.cmp(&y.from))
            .then(x.token.cmp(&y.token))
    });
    candidates.truncate(k);
    if last && !per_token && mistake != Some(BeamMistake::PenaltyMissing) {
        for c in &mut candidates {
            c.score /= divisor(count);
        }
    }
    candidates
}

/// The gap between the k-th and the (k+1)-th best candidates of a step (transformers' ranking):
/// a selection that differs only there, by less than rounding, is a tie, not a mistake.
pub fn margin(logprobs: &[Vec<f32>], scores: &[f32]) -> f32 {
    let k = scores.len();
    let mut all: Vec<f32> = logprobs
        .iter()
        .zip(scores)
        .flat_map(|(row, &s)| row.iter().map(move |&lp| s + lp))
        .collect();
    all.sort_by(|a, b| b.total_cmp(a));
    match (all.get(k.saturating_sub(1)), all.get(k)) {
        (Some(a), Some(b)) => (a - b).abs(),
        _ => f32::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_k_of_all_beams_candidates_and_the_mistakes_keep_others() {
        let logprobs = vec![vec![-0.1, -2.0, -3.0], vec![-0.5, -0.7, -4.0]];
        let scores = [-1.0, -1.2];
        let right = select(&logprobs, &scores, 0, 3, 1.0, None);
        let kept: Vec<(usize, u32)> = right.iter().map(|b| (b.from, b.token)).collect();
        assert_eq!(kept, vec![(0, 0), (1, 0)]);
        assert!((right[0].score + 1.1).abs() < 1e-6);
        let per_beam = select(
            &logprobs,
            &scores,
            0,
            3,
            1.0,
            Some(BeamMistake::PerBeamBest),
        );
        assert_eq!(per_beam.len(), 2);
        let flat = select(
            &logprobs,
            &scores,
            0,
            3,
            1.0,
            Some(BeamMistake::NotCumulative),
        );
        assert_eq!((flat[0].from, flat[0].token, flat[1].from), (0, 0, 1));
        assert!((flat[0].score + 0.1).abs() < 1e-6);
        // The last token: the finished hypotheses' scores divided by 3 ** 1.
        let last = select(&logprobs, &scores, 2, 3, 1.0, None);
        assert!((last[0].score + 1.1 / 3.0).abs() < 1e-6);
        let missing = select(
            &logprobs,
            &scores,
            2,
            3,
            1.0,
            Some(BeamMistake::PenaltyMissing),
        );
        assert!((missing[0].score + 1.1).abs() < 1e-6);
        assert!((margin(&logprobs, &scores) - 0.2).abs() < 1e-6);
    }
}
