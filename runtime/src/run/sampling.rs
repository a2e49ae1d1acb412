//! A port's sampler against transformers' (`decode(generate = N, sample(...))`), once its steps
//! match: the sampler is given the reference's logits of every generated token and golden's probe
//! (whole-number logits: ties), each with golden's uniforms.
//!
//! - A sampler that takes the uniforms ([`Draw::uniform`](crate::Draw::uniform)) must draw the
//!   reference's tokens, every one (`judge/sampler.rs`: a flip across a boundary of the cumulative
//!   distribution within rounding excepted).
//! - One that draws its own random numbers is drawn from many times on the first generated token's
//!   logits and on the probe, and its counts tested against the reference's probabilities
//!   (`judge/distribution.rs`: false-alarm rate and draws stated there).
//!
//! A failure's diagnosis ([`explain`], once per failing check) asks the reference for the same
//! draws with each porting mistake of a sampler made in its processors or its draw
//! ([`SamplerMistake`]) and names those the port's draws fit; then it shrinks the logits vector
//! the failure showed on — fewer tokens, rounder values, fewer previous tokens — to the smallest
//! that still shows it. The reference of those vectors is `golden_ref.sampling.process`, asked
//! through the check's source (recorded with the check's store, replayed from it).

use crate::answers::live::{ReferenceOutputs, Request};
use crate::answers::source::{Answer, Source};
use crate::describe::inputs::CaseParams;
use crate::describe::layer::Layer;
use crate::describe::numbers::num;
use crate::describe::sampling::{self, DrawJob, SamplerMistake, Sampling};
use crate::describe::schedule::Plan;
use crate::judge::distribution;
use crate::judge::sampler::{self, Evidence, SamplerFinding, Vector};
use crate::report::issues::ScheduleIssue;
use crate::report::passed::Note;
use candle_core::DType;
use golden_files::{HostTensor, WireDType};

/// A sampler's tokens for one job, and whether it took golden's uniform at each draw.
#[derive(Clone, Debug, Default)]
pub(crate) struct Drawn {
    pub(crate) tokens: Vec<u32>,
    pub(crate) took: Vec<bool>,
}

/// Runs jobs of draws on the port's sampler (a port call: the model built, its sampler given each
/// job).
pub(crate) type Session<'a> = &'a dyn Fn(Vec<DrawJob>) -> Result<Vec<Drawn>, String>;

/// The sampler's draws out of a port call's outputs (`draw.<i>`, `took.<i>`).
pub(crate) fn drawn(
    outputs: &crate::describe::outputs::Outputs,
    jobs: usize,
) -> Result<Vec<Drawn>, String> {
    (0..jobs)
        .map(|i| {
            let tokens = outputs.leaf(&format!("draw.{i}"))?;
            let took = outputs.leaf(&format!("took.{i}"))?;
            let tokens: Vec<i64> = tokens.to_vec1().map_err(|e| e.to_string())?;
            let took: Vec<u8> = took.to_vec1().map_err(|e| e.to_string())?;
            Ok(Drawn {
                tokens: tokens.into_iter().map(|t| t as u32).collect(),
                took: took.into_iter().map(|t| t == 1).collect(),
            })
        })
        .collect()
}

fn find<'a>(set: &'a [(String, HostTensor)], name: &str) -> Option<&'a HostTensor> {
    set.iter().find(|(n, _)| n == name).map(|(_, t)| t)
}

/// Row `b` of a `[rows, n]` tensor.
fn row(t: &HostTensor, b: usize) -> Vec<f64> {
    let n = t.shape.last().copied().unwrap_or(0);
    t.to_f64()[b * n..(b + 1) * n].to_vec()
}

/// One logits vector the sampler is checked on, with the reference's answer there.
#[derive(Clone, Debug)]
struct Checked {
    vector: Vector,
    probs: Vec<f64>,
    uniforms: Vec<f64>,
    expected: Vec<u32>,
}

/// Each row's tokens so far at each generated token: the prompt's valid ones (the mask's), then
/// the reference's generated tokens before it.
fn previous(
    prompt: &HostTensor,
    mask: Option<&HostTensor>,
    tokens: &HostTensor,
    b: usize,
    j: usize,
) -> Vec<u32> {
    let n = prompt.shape.get(1).copied().unwrap_or(0);
    let ids = prompt.to_i64();
    let mask = mask.map(HostTensor::to_i64);
    let generated = tokens.to_i64();
    let count = tokens.shape.get(1).copied().unwrap_or(0);
    (0..n)
        .filter(|&i| mask.as_ref().is_none_or(|m| m[b * n + i] != 0))
        .map(|i| ids[b * n + i] as u32)
        .chain((0..j).map(|i| generated[b * count + i] as u32))
        .collect()
}

/// The vectors of a case: the reference's logits of each generated token of each row (its one
/// draw), and the probe (its draws).
fn vectors(
    plan: &Plan,
    reference: &ReferenceOutputs,
    prompt: &HostTensor,
) -> Result<Vec<Checked>, String> {
    let sample = plan.sample.as_ref().ok_or("no sampled generation")?;
    let set = &reference.expected;
    let missing = |name: &str| format!("the reference's answer has no `{name}`");
    let tokens = find(set, crate::run::schedule::TOKENS).ok_or_else(|| missing("tokens"))?;
    let (batch, count) = (tokens.shape[0], tokens.shape[1]);
    let u = sample.uniforms.to_f64();
    let generated = tokens.to_i64();
    let mut out = Vec::new();
    for j in 0..count {
        let logits =
            find(set, &format!("sample.{j}.logits")).ok_or_else(|| missing("sample.<j>.logits"))?;
        let probs =
            find(set, &format!("sample.{j}.probs")).ok_or_else(|| missing("sample.<j>.probs"))?;
        for b in 0..batch {
            out.push(Checked {
                vector: Vector {
                    what: format!("the model's logits of generated token {j} of row {b}"),
                    logits: row(logits, b).into_iter().map(|v| v as f32).collect(),
                    previous: previous(prompt, plan.mask.as_ref(), tokens, b, j),
                },
                probs: row(probs, b),
                uniforms: vec![u[b * count + j]],
                expected: vec![generated[b * count + j] as u32],
            });
        }
    }
    let logits = find(set, "sample.probe.logits").ok_or_else(|| missing("sample.probe.logits"))?;
    let probs = find(set, "sample.probe.probs").ok_or_else(|| missing("sample.probe.probs"))?;
    let drawn = find(set, "sample.probe.tokens").ok_or_else(|| missing("sample.probe.tokens"))?;
    out.push(Checked {
        vector: Vector {
            what: "golden's probe (whole-number logits: ties)".into(),
            logits: row(logits, 0).into_iter().map(|v| v as f32).collect(),
            previous: previous(prompt, plan.mask.as_ref(), tokens, 0, count),
        },
        probs: row(probs, 0),
        uniforms: sample.probe_uniforms.to_f64(),
        expected: drawn.to_i64().into_iter().map(|t| t as u32).collect(),
    });
    Ok(out)
}

/// What the sampler checks of a case found: the sampler's finding (or why they could not run),
/// the notes, and whether the sampler takes golden's uniforms (`None`: it was not found out).
pub(crate) struct Verdict {
    pub(crate) issues: Vec<ScheduleIssue>,
    pub(crate) notes: Vec<Note>,
    pub(crate) takes_uniforms: Option<bool>,
}

/// The sampler of a case whose steps match: exactly where it takes golden's uniforms, in
/// distribution where it does not.
pub(crate) fn check(
    plan: &Plan,
    reference: &ReferenceOutputs,
    prompt: &HostTensor,
    seed: u64,
    session: Session<'_>,
) -> Verdict {
    let mut verdict = Verdict {
        issues: Vec::new(),
        notes: Vec::new(),
        takes_uniforms: None,
    };
    let could_not =
        |e: String| ScheduleIssue::CouldNotRun(format!("checking the port's sampler: {e}"));
    let checked = match vectors(plan, reference, prompt) {
        Ok(v) => v,
        Err(e) => {
            verdict.issues.push(could_not(e));
            return verdict;
        }
    };
    let jobs: Vec<DrawJob> = checked
        .iter()
        .map(|c| DrawJob {
            logits: c.vector.logits.clone(),
            previous: c.vector.previous.clone(),
            uniforms: c.uniforms.clone(),
        })
        .collect();
    let results = match session(jobs) {
        Ok(r) => r,
        Err(e) => {
            verdict.issues.push(could_not(e));
            return verdict;
        }
    };
    let took: Vec<bool> = results
        .iter()
        .flat_map(|d| d.took.iter().copied())
        .collect();
    let all = took.iter().all(|&t| t);
    if !all && took.iter().any(|&t| t) {
        verdict.issues.push(could_not(format!(
            "the sampler took golden's uniform (`draw.uniform()`) on {} of its {} draws: a \
             sampler takes it on every draw (checked exactly) or on none (its own random \
             numbers, checked in distribution)",
            took.iter().filter(|&&t| t).count(),
            took.len()
        )));
        return verdict;
    }
    verdict.takes_uniforms = Some(all);
    let draws: usize = took.len();
    if all {
        for (c, d) in checked.iter().zip(&results) {
            if let Some(finding) = exact_finding(c, &d.tokens) {
                verdict
                    .issues
                    .push(ScheduleIssue::Sampler(Box::new(finding)));
                return verdict;
            }
        }
        let summary =
            "the sampler takes golden's uniforms and draws transformers' tokens, every one \
                       (checked exactly)"
                .to_string();
        verdict.notes.push(Note {
            detail: format!(
                "{summary}: {draws} draws, on the model's logits of every generated token and on \
                 golden's probe (whole-number logits: ties)"
            ),
            summary,
        });
        return verdict;
    }
    // Its own random numbers: in distribution, on the first generated token's logits of row 0
    // and on the probe.
    let tested: Vec<&Checked> = [checked.first(), checked.last()]
        .into_iter()
        .flatten()
        .collect();
    let jobs: Vec<DrawJob> = tested
        .iter()
        .enumerate()
        .map(|(i, c)| DrawJob {
            logits: c.vector.logits.clone(),
            previous: c.vector.previous.clone(),
            uniforms: sampling::fresh_uniforms(
                seed,
                &format!("golden.sampling.distribution.{i}"),
                distribution::draws_needed(&c.probs) as usize,
            ),
        })
        .collect();
    let counts: Vec<u64> = jobs.iter().map(|j| j.uniforms.len() as u64).collect();
    let results = match session(jobs) {
        Ok(r) => r,
        Err(e) => {
            verdict.issues.push(could_not(e));
            return verdict;
        }
    };
    for (c, d) in tested.iter().zip(&results) {
        if let Some(finding) = distribution_finding(c, &d.tokens) {
            verdict
                .issues
                .push(ScheduleIssue::Sampler(Box::new(finding)));
            return verdict;
        }
    }
    let summary = format!(
        "the sampler draws its own random numbers: checked in distribution, at a false-alarm rate \
         of {} per test",
        num(distribution::FALSE_ALARM)
    );
    verdict.notes.push(Note {
        detail: format!(
            "{summary} ({} draws on the model's logits of the first generated token, {} on \
             golden's probe: enough to catch a difference of {} in total variation but {} of \
             the time)",
            counts.first().copied().unwrap_or(0),
            counts.get(1).copied().unwrap_or(0),
            num(distribution::SMALLEST_DIFFERENCE),
            num(distribution::MISSED)
        ),
        summary,
    });
    verdict
}

fn exact_finding(c: &Checked, tokens: &[u32]) -> Option<SamplerFinding> {
    let (i, differ) = sampler::exact(&c.probs, &c.uniforms, &c.expected, tokens)?;
    let mut finding = SamplerFinding::new(
        c.vector.clone(),
        Evidence::Exact {
            uniform: c.uniforms[i],
            expected: c.expected[i],
            drawn: tokens[i],
            differ,
            of: c.expected.len(),
            probs: c.probs.clone(),
        },
    );
    finding.draws = (c.uniforms.clone(), tokens.to_vec());
    Some(finding)
}

fn counts(tokens: &[u32], vocab: usize) -> Vec<u64> {
    let mut counts = vec![0u64; vocab];
    for &t in tokens {
        if (t as usize) >= counts.len() {
            counts.resize(t as usize + 1, 0);
        }
        counts[t as usize] += 1;
    }
    counts
}

fn distribution_finding(c: &Checked, tokens: &[u32]) -> Option<SamplerFinding> {
    let fit = distribution::goodness_of_fit(&c.probs, &counts(tokens, c.probs.len()));
    if fit.passes() {
        return None;
    }
    let mut finding = SamplerFinding::new(c.vector.clone(), Evidence::Distribution(fit));
    finding.draws = (Vec::new(), tokens.to_vec());
    Some(finding)
}

/// The free-running pass of a sampled generation: the port's own tokens (its logits, its
/// sampler, golden's uniforms) against the reference's. A sampler that draws its own random
/// numbers cannot draw the reference's tokens: a note. Where they first differ, a flip across a
/// boundary of the reference's cumulative distribution within the rounding the port's logits may
/// have (ten times [`sampler::FLIP`]) is a note; otherwise a failure.
pub(crate) fn free_running(
    port: &[(String, HostTensor)],
    reference: &ReferenceOutputs,
    plan: &Plan,
    takes_uniforms: Option<bool>,
) -> Result<Note, ScheduleIssue> {
    if takes_uniforms != Some(true) {
        let summary =
            "free-running, the port's sampled tokens are not compared: its sampler draws \
                       its own random numbers"
                .to_string();
        return Ok(Note {
            detail: summary.clone(),
            summary,
        });
    }
    let (Some(ours), Some(theirs), Some(sample)) = (
        find(port, crate::run::schedule::TOKENS),
        find(&reference.expected, crate::run::schedule::TOKENS),
        plan.sample.as_ref(),
    ) else {
        return Err(ScheduleIssue::FreeRunning(
            "the free-running pass produced no tokens".into(),
        ));
    };
    let count = theirs.shape.get(1).copied().unwrap_or(1).max(1);
    let (ours, theirs) = (ours.to_i64(), theirs.to_i64());
    let Some(at) = (0..ours.len().min(theirs.len())).find(|&i| ours[i] != theirs[i]) else {
        let summary = "free-running, the port draws the reference's sampled tokens with golden's \
                       uniforms"
            .to_string();
        return Ok(Note {
            detail: format!("{summary} ({count} per row)"),
            summary,
        });
    };
    let (b, j) = (at / count, at % count);
    let u = sample.uniforms.to_f64()[at];
    let probs = find(&reference.expected, &format!("sample.{j}.probs")).map(|p| row(p, b));
    let what = format!(
        "free-running, at generated token {j} of row {b} the port draws token {} where the \
         reference draws {} with golden's uniform u = {}",
        ours[at],
        theirs[at],
        num(u)
    );
    let near = probs.as_ref().is_some_and(|p| {
        let total: f64 = p.iter().sum();
        let mut acc = 0.0;
        p.iter().any(|q| {
            acc += q;
            (acc / total - u).abs() < 10.0 * sampler::FLIP
        })
    });
    if near {
        let summary = "free-running, the port's sampled tokens part from the reference's where a \
                       uniform falls at a boundary of the cumulative distribution within rounding"
            .to_string();
        return Ok(Note {
            detail: format!("{what}: u is within rounding of a boundary there, not a failure"),
            summary,
        });
    }
    Err(ScheduleIssue::FreeRunning(format!(
        "{what}, far from any boundary of its cumulative distribution: the teacher-forced steps and \
         the sampler on the reference's logits matched, so on its own tokens the port computes \
         other logits or gives its sampler other previous tokens (the generated ones missing from \
         the repetition penalty's context, a cache written twice)"
    )))
}

/// The keywords of `golden_ref.sampling.process` for `sampling`'s parameters.
fn keywords(sampling: &Sampling) -> Vec<(&'static str, crate::describe::layer::Value)> {
    use crate::describe::layer::Value;
    let mut out = Vec::new();
    if let Some(t) = sampling.temperature {
        out.push(("temperature", Value::Float(t)));
    }
    if let Some(k) = sampling.top_k {
        out.push(("top_k", Value::Int(k as i64)));
    }
    if let Some(p) = sampling.top_p {
        out.push(("top_p", Value::Float(p)));
    }
    if let Some(p) = sampling.min_p {
        out.push(("min_p", Value::Float(p)));
    }
    if let Some(r) = sampling.repetition_penalty {
        out.push(("repetition_penalty", Value::Float(r)));
    }
    out
}

/// The reference of a logits vector: `golden_ref.sampling.process`, a function-form check of its
/// own asked through the check's source (so recorded in its store and replayed from it).
fn process_layer(layer: &Layer, sampling: &Sampling, mistake: Option<SamplerMistake>) -> Layer {
    let mut derived = Layer::function(layer.name(), "golden_ref.sampling.process");
    for (k, v) in keywords(sampling) {
        derived = derived.konst(k, v);
    }
    if let Some(m) = mistake {
        derived = derived.konst("mistake", crate::describe::layer::Value::Str(m.token()));
    }
    derived
}

/// The reference's probabilities and draws on `vector` with `uniforms` (with `mistake` made), and
/// whether top-p's cut falls inside a tie there (where transformers' choice is an accident of its
/// sort); `None` where the source has no answer (a replay that did not record it).
fn reference_draws(
    layer: &Layer,
    sampling: &Sampling,
    mistake: Option<SamplerMistake>,
    source: &Source,
    params: &CaseParams,
    vector: &Vector,
    uniforms: &[f64],
) -> Option<(Vec<f64>, Vec<u32>, bool)> {
    let derived = process_layer(layer, sampling, mistake);
    let vocab = vector.logits.len();
    let logits = HostTensor::from_floats(
        vec![1, vocab],
        &vector
            .logits
            .iter()
            .map(|&v| f64::from(v))
            .collect::<Vec<_>>(),
        WireDType::F32,
    );
    let previous = if vector.previous.is_empty() {
        vec![-1i64]
    } else {
        vector.previous.iter().map(|&t| i64::from(t)).collect()
    };
    let previous = HostTensor {
        dtype: WireDType::I64,
        shape: vec![1, previous.len()],
        data: previous
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
    };
    let u = HostTensor::from_floats(vec![1, uniforms.len()], uniforms, WireDType::F64);
    let args = [logits, previous, u];
    let request = Request::Forward {
        args: &args,
        trace: false,
        twice: false,
        precise: false,
        plan: None,
        stage: None,
    };
    let Answer::Outputs(r) = source.request(&derived, DType::F32, params, &request) else {
        return None;
    };
    let probs = find(&r.expected, "out.probs")?.to_f64();
    let tokens = find(&r.expected, "out.tokens")?
        .to_i64()
        .into_iter()
        .map(|t| t as u32)
        .collect();
    let ambiguous =
        find(&r.expected, "out.ambiguous").is_some_and(|a| a.to_i64().iter().any(|&v| v != 0));
    Some((probs, tokens, ambiguous))
}

/// How many uniforms the diagnosis of an exact failure draws with (the failing one first).
const DIAGNOSIS_DRAWS: usize = 64;

/// The most candidates shrinking a logits vector tries.
const SHRINK_BUDGET: usize = 48;

/// Whether the port's sampler still fails on `vector`: with `uniforms` (exact) or with its own
/// random numbers (distribution). `None` where the reference has no answer.
fn fails_on(
    layer: &Layer,
    sampling: &Sampling,
    source: &Source,
    params: &CaseParams,
    session: Session<'_>,
    vector: &Vector,
    exact: Option<&[f64]>,
) -> Option<bool> {
    let uniforms = match exact {
        Some(u) => u.to_vec(),
        None => vec![0.5],
    };
    let (probs, expected, ambiguous) =
        reference_draws(layer, sampling, None, source, params, vector, &uniforms)?;
    if ambiguous {
        // Shrinking never keeps a vector whose top-p cut splits a tie: no port is held there.
        return Some(false);
    }
    let uniforms = match exact {
        Some(_) => uniforms,
        None => sampling::fresh_uniforms(
            params.seed,
            "golden.sampling.shrink",
            distribution::draws_needed(&probs) as usize,
        ),
    };
    let job = DrawJob {
        logits: vector.logits.clone(),
        previous: vector.previous.clone(),
        uniforms: uniforms.clone(),
    };
    let drawn = session(vec![job]).ok()?.pop()?;
    Some(match exact {
        Some(_) => sampler::exact(&probs, &uniforms, &expected, &drawn.tokens).is_some(),
        None => {
            !distribution::goodness_of_fit(&probs, &counts(&drawn.tokens, probs.len())).passes()
        }
    })
}

/// `vector` without token `i` (the previous tokens renumbered).
fn without(vector: &Vector, drop: &[usize]) -> Vector {
    let keep: Vec<usize> = (0..vector.logits.len())
        .filter(|i| !drop.contains(i))
        .collect();
    let renumber = |t: u32| keep.iter().position(|&k| k == t as usize).map(|p| p as u32);
    Vector {
        what: vector.what.clone(),
        logits: keep.iter().map(|&i| vector.logits[i]).collect(),
        previous: vector
            .previous
            .iter()
            .filter_map(|&t| renumber(t))
            .collect(),
    }
}

/// Simpler vectors than `v`, simplest first: fewer tokens (halves, then one at a time), rounder
/// values (whole numbers, then one value at 0), fewer previous tokens.
fn candidates(v: &Vector) -> Vec<Vector> {
    let n = v.logits.len();
    let mut out = Vec::new();
    if n >= 4 {
        out.push(without(v, &(n / 2..n).collect::<Vec<_>>()));
        out.push(without(v, &(0..n / 2).collect::<Vec<_>>()));
    }
    if n > 2 {
        out.extend((0..n).rev().map(|i| without(v, &[i])));
    }
    let rounded: Vec<f32> = v.logits.iter().map(|x| x.round()).collect();
    if rounded != v.logits {
        out.push(Vector {
            logits: rounded,
            ..v.clone()
        });
    }
    for i in 0..n {
        if v.logits[i] != 0.0 && v.logits[i].is_finite() {
            let mut logits = v.logits.clone();
            logits[i] = 0.0;
            out.push(Vector {
                logits,
                ..v.clone()
            });
        }
    }
    if !v.previous.is_empty() {
        out.push(Vector {
            previous: Vec::new(),
            ..v.clone()
        });
        for i in 0..v.previous.len() {
            let mut previous = v.previous.clone();
            previous.remove(i);
            out.push(Vector {
                previous,
                ..v.clone()
            });
        }
    }
    out
}

/// The diagnosis of a sampler's failure, on the check's final failure: the mistakes the port's
/// draws fit, and the smallest logits vector that still shows it.
pub(crate) fn explain(
    layer: &Layer,
    source: &Source,
    params: &CaseParams,
    finding: &mut SamplerFinding,
    session: Session<'_>,
) {
    let Some(sampling) = layer.decoding().and_then(|d| d.sample.clone()) else {
        return;
    };
    let replay = if source.is_replay() {
        " (a replay answers only the vectors recorded with its store)"
    } else {
        ""
    };
    // The draws the mistakes are tested on: exact, the failing uniform and more; in
    // distribution, the draws that failed.
    let exact = matches!(finding.evidence, Evidence::Exact { .. });
    let (uniforms, tokens) = if exact {
        let Evidence::Exact { uniform, .. } = finding.evidence else {
            unreachable!("exact")
        };
        let mut u = vec![uniform];
        u.extend(sampling::fresh_uniforms(
            params.seed,
            "golden.sampling.diagnosis",
            DIAGNOSIS_DRAWS - 1,
        ));
        let job = DrawJob {
            logits: finding.vector.logits.clone(),
            previous: finding.vector.previous.clone(),
            uniforms: u.clone(),
        };
        match session(vec![job]).map(|mut d| d.pop().unwrap_or_default()) {
            Ok(d) => (u, d.tokens),
            Err(e) => {
                finding
                    .notes
                    .push(format!("the diagnosis could not run the sampler: {e}"));
                return;
            }
        }
    } else {
        finding.draws.clone()
    };
    let mut causes = Vec::new();
    let mut unanswered = false;
    for mistake in SamplerMistake::ALL
        .into_iter()
        .filter(|m| m.applies(&sampling))
    {
        if !exact && mistake.same_distribution() {
            continue;
        }
        let asked = if exact { uniforms.clone() } else { vec![0.5] };
        let Some((probs, expected, _)) = reference_draws(
            layer,
            &sampling,
            Some(mistake),
            source,
            params,
            &finding.vector,
            &asked,
        ) else {
            unanswered = true;
            continue;
        };
        let fits = if exact {
            sampler::exact(&probs, &uniforms, &expected, &tokens).is_none()
        } else {
            let fit = distribution::goodness_of_fit(&probs, &counts(&tokens, probs.len()));
            // Tokens the reference cannot draw: a mistake explains them when, with it, every
            // token the port drew could be drawn.
            let explains_impossible = match &finding.evidence {
                Evidence::Distribution(right) if !right.impossible.is_empty() => {
                    fit.impossible.is_empty()
                }
                _ => false,
            };
            fit.passes() || explains_impossible
        };
        if fits {
            let (what, instead, fix) = mistake.explain();
            causes.push(format!(
                "the port draws as transformers' sampler does with {what} (instead of {instead}) \
                 — fix: {fix}"
            ));
        }
    }
    if causes.is_empty() {
        finding.notes.push(format!(
            "no mistake golden knows of a sampler (a processor skipped or reordered, top-p's cut \
             one token off, top-k's ties, an unnormalised or sorted draw, the same token every \
             time, the repetition penalty's sign) draws as the port does{}",
            if unanswered { replay } else { "" }
        ));
    }
    causes.truncate(3);
    finding.causes = causes;
    // The smallest logits vector that still shows it.
    let mut current = finding.vector.clone();
    let mut tried = 0;
    let mut shrunk = false;
    'search: loop {
        for candidate in candidates(&current) {
            if tried >= SHRINK_BUDGET {
                break 'search;
            }
            tried += 1;
            let probe = exact.then_some(uniforms.as_slice());
            if fails_on(layer, &sampling, source, params, session, &candidate, probe) == Some(true)
            {
                current = candidate;
                shrunk = true;
                continue 'search;
            }
        }
        break;
    }
    if shrunk {
        let probs = reference_draws(layer, &sampling, None, source, params, &current, &[0.5])
            .map(|(p, _, _)| p);
        finding.smallest = Some(format!(
            "logits {} after previous tokens {:?}{}",
            sampler::values(&current.logits, 16),
            current.previous,
            probs
                .map(|p| format!(
                    " (transformers' probabilities: {})",
                    sampler::support(&p, 8)
                ))
                .unwrap_or_default()
        ));
    } else if source.is_replay() {
        finding
            .notes
            .push(format!("the logits vector was not shrunk{replay}"));
    }
}
