//! A port's beam search against transformers' (`decode(generate = N, beams = k)`), once its steps
//! match along the best beam: for every generated token of every row, golden gives the port the
//! reference's k running beams and compares, in turn,
//!
//! 1. the port's model's log-probabilities of every candidate token of every running beam (each
//!    beam's whole sequence fed from position 0 to a freshly built port: there is no cache to
//!    reorder, slower than a cache but exact) with the reference's, within the tolerance;
//! 2. the beams its beam step keeps, given the reference's log-probabilities and scores (so a
//!    mistake in the model and one in the selection are told apart), with the reference's: the
//!    beam each extends, its token, its score. A selection that differs where the reference's
//!    k-th and (k+1)-th candidates are within rounding of each other is a tie, a note; otherwise
//!    the first step, row and beam that differ are named, with the usual mistakes of a beam step
//!    (`judge/beams.rs`) that keep the same beams as the port.

use crate::answers::live::ReferenceOutputs;
use crate::describe::beams::{Beam, BeamJob};
use crate::describe::layer::Tol;
use crate::describe::numbers::num;
use crate::describe::schedule::Plan;
use crate::judge::beams::{self, BeamMistake};
use crate::report::issues::ScheduleIssue;
use crate::report::passed::Note;
use golden_files::HostTensor;

/// The prefix of the reference's beam-search leaves (`beams.<j>.…`).
pub(crate) const BEAMS: &str = "beams.";

/// The tolerance of log-probabilities and scores where the check declares none: float32
/// log-softmax of a model's logits, summed over a few tokens.
const DEFAULT_TOL: Tol = Tol {
    atol: 1e-4,
    rtol: 1e-5,
};

/// Runs one beam step on the port: its outputs `beam.logprobs`, `beam.from`, `beam.tokens`,
/// `beam.scores`.
pub(crate) type Session<'a> = &'a dyn Fn(BeamJob) -> Result<Vec<(String, HostTensor)>, String>;

/// What the beam-search check of a case found.
pub(crate) struct Verdict {
    pub(crate) issues: Vec<ScheduleIssue>,
    pub(crate) notes: Vec<Note>,
}

fn find<'a>(set: &'a [(String, HostTensor)], name: &str) -> Result<&'a HostTensor, String> {
    set.iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| format!("the reference's answer has no `{name}`"))
}

/// Row `b` of a tensor whose first axis is the batch, as `[k][rest]` f64.
fn rows(t: &HostTensor, b: usize) -> Vec<Vec<f64>> {
    let k = t.shape.get(1).copied().unwrap_or(1);
    let rest: usize = t.shape.iter().skip(2).product();
    let all = t.to_f64();
    (0..k)
        .map(|i| all[(b * k + i) * rest..(b * k + i + 1) * rest].to_vec())
        .collect()
}

fn within(tol: Tol, port: f64, reference: f64) -> bool {
    (port - reference).abs() <= tol.atol + tol.rtol * reference.abs()
}

fn shown(beams: &[Beam]) -> String {
    let each: Vec<String> = beams
        .iter()
        .map(|b| {
            format!(
                "{} from beam {} ({})",
                b.token,
                b.from,
                num(f64::from(b.score))
            )
        })
        .collect();
    format!("[{}]", each.join(", "))
}

/// The reference's step `j` of row `b`: the job asked of the port and the beams it keeps.
fn reference_step(
    set: &[(String, HostTensor)],
    plan: &Plan,
    j: usize,
    b: usize,
    length_penalty: f64,
) -> Result<(BeamJob, Vec<Beam>), String> {
    let leaf = |what: &str| find(set, &format!("{BEAMS}{j}.{what}"));
    let sequences = rows(leaf("sequences")?, b)
        .into_iter()
        .map(|r| r.into_iter().map(|t| t as u32).collect())
        .collect();
    let scores: Vec<f32> = rows(leaf("scores")?, b)
        .into_iter()
        .map(|r| r[0] as f32)
        .collect();
    let logprobs = rows(leaf("logprobs")?, b)
        .into_iter()
        .map(|r| r.into_iter().map(|v| v as f32).collect())
        .collect();
    let from = rows(leaf("from")?, b);
    let tokens = rows(leaf("tokens")?, b);
    let next = rows(leaf("next")?, b);
    let kept = (0..from.len())
        .map(|i| Beam {
            from: from[i][0] as usize,
            token: tokens[i][0] as u32,
            score: next[i][0] as f32,
        })
        .collect();
    Ok((
        BeamJob {
            sequences,
            scores,
            logprobs,
            index: j,
            count: plan.steps.generate,
            length_penalty,
        },
        kept,
    ))
}

/// The port's beams out of a beam step's outputs, best first (by score; ties kept in its order).
fn port_beams(outputs: &[(String, HostTensor)]) -> Result<Vec<Beam>, String> {
    let from = find(outputs, "beam.from")?.to_i64();
    let tokens = find(outputs, "beam.tokens")?.to_i64();
    let scores = find(outputs, "beam.scores")?.to_f64();
    let mut beams: Vec<Beam> = (0..from.len().min(tokens.len()).min(scores.len()))
        .map(|i| Beam {
            from: from[i] as usize,
            token: tokens[i] as u32,
            score: scores[i] as f32,
        })
        .collect();
    beams.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(beams)
}

/// The first beam where `port` differs from `reference` (its token or the beam it extends, or its
/// score beyond `tol`), or where one has fewer beams.
fn first_difference(tol: Tol, port: &[Beam], reference: &[Beam]) -> Option<usize> {
    (0..port.len().max(reference.len())).find(|&i| match (port.get(i), reference.get(i)) {
        (Some(p), Some(r)) => {
            p.from != r.from
                || p.token != r.token
                || !within(tol, f64::from(p.score), f64::from(r.score))
        }
        _ => true,
    })
}

/// The port's beams after a step against the reference's (`kept`), from the same
/// log-probabilities and scores (`job`): `None` where they are the same; a tie within rounding
/// (`Ok`, a note); otherwise the failure, with the mistakes of a beam step that keep the port's
/// beams (`Err`).
fn selection(
    at: &str,
    job: &BeamJob,
    kept: &[Beam],
    port: &[Beam],
    tol: Tol,
) -> Option<Result<String, String>> {
    let i = first_difference(tol, port, kept)?;
    let margin = beams::margin(&job.logprobs, &job.scores);
    let same_set = {
        let key = |v: &[Beam]| {
            let mut k: Vec<(usize, u32)> = v.iter().map(|b| (b.from, b.token)).collect();
            k.sort_unstable();
            k
        };
        key(port) == key(kept)
    };
    let top = kept.first().map_or(0.0, |b| f64::from(b.score).abs());
    let rounding = 10.0 * (tol.atol + tol.rtol * top);
    if f64::from(margin) <= rounding && !same_set && port.len() == kept.len() {
        return Some(Ok(format!(
            "{at}, the port keeps {} where transformers keeps {}: its {}-th and \
             {}-th best candidates are {} apart, within rounding",
            shown(port),
            shown(kept),
            kept.len(),
            kept.len() + 1,
            num(f64::from(margin))
        )));
    }
    let what = match (port.get(i), kept.get(i)) {
        (Some(p), Some(r)) => format!(
            "its beam {i} is token {} from running beam {} with score {} where \
             transformers' beam {i} is token {} from running beam {} with score {}",
            p.token,
            p.from,
            num(f64::from(p.score)),
            r.token,
            r.from,
            num(f64::from(r.score))
        ),
        _ => format!(
            "it keeps {} beams where transformers keeps {}",
            port.len(),
            kept.len()
        ),
    };
    let causes: Vec<String> = BeamMistake::ALL
        .into_iter()
        .filter(|&m| {
            let mine = beams::select(
                &job.logprobs,
                &job.scores,
                job.index,
                job.count,
                job.length_penalty,
                Some(m),
            );
            mine != kept && first_difference(tol, port, &mine).is_none()
        })
        .map(|m| {
            let (what, instead, fix) = m.explain();
            format!(
                "likely cause: the port's beam search with {what} (instead of \
                 {instead}) — fix: {fix}"
            )
        })
        .collect();
    let causes = if causes.is_empty() {
        "no mistake golden knows of a beam step (scores not cumulative, the length \
         penalty applied per token or missing, each beam extended by its own best token \
         only) keeps the beams the port keeps"
            .to_string()
    } else {
        causes.join("\n  ")
    };
    Some(Err(format!(
        "{at}{}, the port's beam step, given transformers' log-probabilities and the \
         running beams' scores {:?}, keeps other beams: {what} (the port's beams: {}; \
         transformers': {})\n  the model's log-probabilities of every candidate matched, \
         so the selection differs\n  {causes}",
        if job.index + 1 == job.count {
            " (the last: the finished hypotheses, length-penalised)"
        } else {
            ""
        },
        job.scores,
        shown(port),
        shown(kept),
    )))
}

/// The beam search of a case whose steps match along the best beam.
pub(crate) fn check(
    plan: &Plan,
    reference: &ReferenceOutputs,
    tol: Option<Tol>,
    session: Session<'_>,
) -> Verdict {
    let mut verdict = Verdict {
        issues: Vec::new(),
        notes: Vec::new(),
    };
    let Some(search) = &plan.beams else {
        return verdict;
    };
    let tol = tol.unwrap_or(DEFAULT_TOL);
    let could_not =
        |e: String| ScheduleIssue::CouldNotRun(format!("checking the beam search: {e}"));
    let set = &reference.expected;
    let batch = match find(set, &format!("{BEAMS}0.scores")) {
        Ok(t) => t.shape.first().copied().unwrap_or(1),
        Err(e) => {
            verdict.issues.push(could_not(e));
            return verdict;
        }
    };
    let mut ties = Vec::new();
    for j in 0..plan.steps.generate {
        for b in 0..batch {
            let (job, kept) = match reference_step(set, plan, j, b, search.length_penalty) {
                Ok(r) => r,
                Err(e) => {
                    verdict.issues.push(could_not(e));
                    return verdict;
                }
            };
            let at = format!("at generated token {j} of row {b}");
            let outputs = match session(job.clone()) {
                Ok(o) => o,
                Err(e) => {
                    verdict.issues.push(could_not(e));
                    return verdict;
                }
            };
            // 1. The model's log-probabilities of every candidate of every running beam.
            let logprobs = match find(&outputs, "beam.logprobs") {
                Ok(t) => t,
                Err(_) => {
                    verdict.issues.push(could_not(
                        "the port's beam step returned no log-probabilities".into(),
                    ));
                    return verdict;
                }
            };
            let vocab = job.logprobs.first().map_or(0, Vec::len);
            if logprobs.shape != [job.sequences.len(), vocab] {
                verdict.issues.push(ScheduleIssue::Beams(format!(
                    "{at}, the port's model gives log-probabilities of shape {:?} for the {} \
                     running beams, where transformers' beam search has [{}, {vocab}]",
                    logprobs.shape,
                    job.sequences.len(),
                    job.sequences.len()
                )));
                return verdict;
            }
            let ours = logprobs.to_f64();
            let worst = (0..ours.len())
                .filter_map(|i| {
                    let r = f64::from(job.logprobs[i / vocab][i % vocab]);
                    let excess = (ours[i] - r).abs() - (tol.atol + tol.rtol * r.abs());
                    (excess > 0.0 || ours[i].is_nan()).then_some((i, excess))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((i, _)) = worst {
                let (beam, token) = (i / vocab, i % vocab);
                let r = f64::from(job.logprobs[beam][token]);
                verdict.issues.push(ScheduleIssue::Beams(format!(
                    "{at}, the port's model gives candidate token {token} of running beam {beam} \
                     (the sequence {:?}) the log-probability {} where transformers' beam search \
                     has {} (difference {}, beyond the tolerance atol {} + rtol {} · |ref|)\n  \
                     the teacher-forced steps matched along the best beam, and golden fed each \
                     running beam's whole sequence from position 0 to a freshly built port: the \
                     model's output for one beam depends on the others in the batch (rows \
                     mixed), or on state kept between calls (a cache not rebuilt, or not \
                     reordered by the beam indices)",
                    job.sequences[beam],
                    num(ours[i]),
                    num(r),
                    num((ours[i] - r).abs()),
                    num(tol.atol),
                    num(tol.rtol),
                )));
                return verdict;
            }
            // 2. The beams its beam step keeps, from the reference's log-probabilities.
            let port = match port_beams(&outputs) {
                Ok(p) => p,
                Err(e) => {
                    verdict.issues.push(could_not(e));
                    return verdict;
                }
            };
            match selection(&at, &job, &kept, &port, tol) {
                None => {}
                Some(Ok(tie)) => ties.push(tie),
                Some(Err(issue)) => {
                    verdict.issues.push(ScheduleIssue::Beams(issue));
                    return verdict;
                }
            }
        }
    }
    let summary = "the port's model gives transformers' log-probabilities to every candidate of \
                   every running beam, and its beam step keeps transformers' beams (checked \
                   step by step from the reference's beams)"
        .to_string();
    verdict.notes.push(Note {
        detail: format!(
            "{summary}: {} generated tokens, {} beams, length penalty {}",
            plan.steps.generate,
            search.beams,
            num(search.length_penalty)
        ),
        summary,
    });
    if let Some(first) = ties.first() {
        verdict.notes.push(Note {
            summary: "the beam step's choice differs from transformers' at a tie within rounding"
                .into(),
            detail: first.clone(),
        });
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(logprobs: Vec<Vec<f32>>, scores: Vec<f32>, index: usize) -> BeamJob {
        BeamJob {
            sequences: vec![vec![1, 2]; scores.len()],
            scores,
            logprobs,
            index,
            count: 3,
            length_penalty: 1.0,
        }
    }

    #[test]
    fn the_same_beams_pass_a_tie_is_a_note_and_a_mistake_is_named() {
        // Two beams; candidates (score + log-probability): beam 0 token 0 -1.1, beam 1 token 0
        // -1.7, beam 1 token 1 -1.9, beam 0 token 1 -3.0.
        let j = job(
            vec![vec![-0.1, -2.0], vec![-0.5, -0.7]],
            vec![-1.0, -1.2],
            0,
        );
        let kept = beams::select(&j.logprobs, &j.scores, 0, 3, 1.0, None);
        assert!(selection("at", &j, &kept, &kept, DEFAULT_TOL).is_none());
        // Scores not cumulative: beam 0 token 0 (-0.1), then beam 1 token 0 (-0.5).
        let port = beams::select(
            &j.logprobs,
            &j.scores,
            0,
            3,
            1.0,
            Some(BeamMistake::NotCumulative),
        );
        let Some(Err(issue)) = selection(
            "at generated token 0 of row 0",
            &j,
            &kept,
            &port,
            DEFAULT_TOL,
        ) else {
            panic!("a mistake passed")
        };
        assert!(
            issue.contains("its beam 0 is token 0 from running beam 0 with score -0.1"),
            "{issue}"
        );
        assert!(
            issue.contains(
                "likely cause: the port's beam search with scores that are not cumulative"
            ),
            "{issue}"
        );
        // The 2nd and 3rd candidates tied within rounding: the other one kept is a note.
        let tied = job(
            vec![vec![-0.1, -2.0], vec![-0.5, -0.5000001]],
            vec![-1.0, -1.2],
            0,
        );
        let kept = beams::select(&tied.logprobs, &tied.scores, 0, 3, 1.0, None);
        let mut port = kept.clone();
        port[1].token = 1 - port[1].token;
        let Some(Ok(tie)) = selection("at", &tied, &kept, &port, DEFAULT_TOL) else {
            panic!("a tie failed")
        };
        assert!(tie.contains("within rounding"), "{tie}");
        // The same beams with another score: not a tie.
        let mut port = kept.clone();
        port[0].score -= 0.5;
        assert!(matches!(
            selection("at", &tied, &kept, &port, DEFAULT_TOL),
            Some(Err(_))
        ));
    }
}
