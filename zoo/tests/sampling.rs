//! Sampling that matches: a tiny Llama's generation, `decode(generate = N, sample(...))`, against
//! transformers' `generate(do_sample=True)` with golden's uniforms in place of `torch.multinomial`
//! (`golden_ref/sampling.py`). The model is candle-transformers 0.11.1's Llama, unmodified (its
//! cache passed in and out of `forward`); the samplers are:
//!
//! - a sampler written after transformers' processors that takes golden's uniform and draws by
//!   inverse CDF in vocabulary order: checked exactly, every draw;
//! - candle-transformers' own `LogitsProcessor` (with `utils::apply_repeat_penalty`), drawing its
//!   own random numbers: checked in distribution;
//! - wrong samplers, each a porting mistake written after the mechanism: caught, and named by the
//!   diagnosis (the words asserted); and candle-transformers' `Sampling::TopKThenTopP`, whose
//!   top-p sums the whole vocabulary's probabilities after top-k where transformers renormalises.
//!
//! Each check has a golden store in `tests/golden/`, so the assertions hold in replay, with no
//! Python.

// A `Failure` carries the whole failing case; these helpers return it as the checks do.
#![allow(clippy::result_large_err)]

mod common;

use candle_core::{DType, Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling as CandleSampling};
use candle_transformers::models::llama;
use common::{declared_with_store, tiny_llama, Scratch};
use golden::{Decode, Draw, Failure, Layer, Report, Sampled, Sampling, Step};
use std::collections::BTreeMap;

/// transformers' `generate(do_sample=True)` with every processor of the issue.
fn full() -> Sampling {
    Sampling::new()
        .temperature(0.7)
        .top_k(8)
        .top_p(0.9)
        .min_p(0.05)
        .repetition_penalty(1.3)
}

/// A tiny `LlamaForCausalLM` generating 3 tokens by sampling after a prompt of 2 to 5.
fn sampled_llama(name: &str, sampling: Sampling) -> Layer {
    tiny_llama::layer(name)
        .decode(Decode {
            generate: 3,
            sample: Some(sampling),
            ..Decode::over("input_ids")
        })
        .cases(4)
        // A transformer's first request imports transformers: allow for it on a busy machine.
        .timeout(180.0)
}

/// The port: candle-transformers' Llama with the sampler `make` builds, per model built.
fn port<S: golden::Sampler + 'static>(
    make: impl Fn() -> S + Clone + Send + Sync + 'static,
) -> impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String> + Clone + Send + Sync + 'static
{
    move |inputs: &golden::PortInputs| {
        let make = make.clone();
        golden::drive(inputs, move |inputs| {
            let config = tiny_llama::config();
            let built = (|| -> candle_core::Result<_> {
                let model = llama::Llama::load(inputs.var_builder(), &config)?;
                let cache = llama::Cache::new(true, DType::F32, &config, &Device::Cpu)?;
                Ok((model, cache))
            })();
            let made = built.map(|(model, mut cache)| Sampled {
                model: move |step: &Step| -> candle_core::Result<BTreeMap<&'static str, Tensor>> {
                    let logits =
                        model.forward(step.input("input_ids")?, step.offset(), &mut cache)?;
                    Ok([("logits", logits)].into())
                },
                sampler: make(),
            });
            golden::IntoStepper::into_stepper(made)
        })
    }
}

fn check(
    layer: &Layer,
    port: impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String>
        + Clone
        + Send
        + Sync
        + 'static,
) -> Result<Report, Failure> {
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    golden::check(&layer, &port)
}

/// A sampler as the tests build them.
type BoxedSampler = Box<dyn FnMut(&Draw) -> candle_core::Result<u32>>;

/// A porting mistake the test sampler makes on purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Flaw {
    #[default]
    None,
    TemperatureLast,
    TopPDropsCrossing,
    TopPKeepsOneMore,
    TopKTiesByIndex,
    PenaltySkipped,
    Unnormalised,
    SameTokenEveryTime,
}

/// A sampler written after transformers' processors (repetition penalty, temperature, top-k,
/// top-p, min-p, in that order), in float32 as `generate()` computes them, drawing with golden's
/// uniform: the first token in vocabulary order whose cumulative probability exceeds `u · Σp`.
#[derive(Clone, Copy, Debug)]
struct UniformSampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    penalty: f32,
    flaw: Flaw,
}

impl UniformSampler {
    fn new(flaw: Flaw) -> Self {
        UniformSampler {
            temperature: 0.7,
            top_k: 8,
            top_p: 0.9,
            min_p: 0.05,
            penalty: 1.3,
            flaw,
        }
    }

    fn softmax(s: &[f32]) -> Vec<f32> {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }

    fn top_k(&self, s: &mut [f32]) {
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
        let k = self.top_k.min(s.len());
        if self.flaw == Flaw::TopKTiesByIndex {
            for &i in &order[k..] {
                s[i] = f32::NEG_INFINITY;
            }
            return;
        }
        let kth = s[order[k - 1]];
        for x in s.iter_mut() {
            if *x < kth {
                *x = f32::NEG_INFINITY;
            }
        }
    }

    fn top_p(&self, s: &mut [f32]) {
        let probs = Self::softmax(s);
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
        if self.flaw != Flaw::TopPDropsCrossing && self.flaw != Flaw::TopPKeepsOneMore {
            // transformers': ascending order (ties: the lower index first), the tokens whose
            // cumulative probability from the bottom is at most 1 − p removed, the top one kept.
            let mut ascending: Vec<usize> = (0..s.len()).collect();
            ascending.sort_by(|&a, &b| s[a].total_cmp(&s[b]).then(a.cmp(&b)));
            let sorted: Vec<f32> = ascending.iter().map(|&i| s[i]).collect();
            let probs = Self::softmax(&sorted);
            let mut cum = 0f32;
            let last = ascending.len() - 1;
            for (rank, &i) in ascending.iter().enumerate() {
                cum += probs[rank];
                if rank < last && cum <= 1.0 - self.top_p {
                    s[i] = f32::NEG_INFINITY;
                }
            }
            return;
        }
        let mut before = 0f32;
        let mut removed = Vec::new();
        let mut cut_before_previous = false;
        for (rank, &i) in order.iter().enumerate() {
            let remove = match self.flaw {
                Flaw::TopPDropsCrossing => rank > 0 && before + probs[i] > self.top_p,
                Flaw::TopPKeepsOneMore => cut_before_previous,
                _ => rank > 0 && before >= self.top_p,
            };
            cut_before_previous = rank > 0 && before >= self.top_p || cut_before_previous;
            if remove {
                removed.push(i);
            }
            before += probs[i];
        }
        for i in removed {
            s[i] = f32::NEG_INFINITY;
        }
    }

    fn min_p(&self, s: &mut [f32]) {
        let probs = Self::softmax(s);
        let top = probs.iter().copied().fold(0f32, f32::max);
        for (x, p) in s.iter_mut().zip(&probs) {
            if *p < self.min_p * top {
                *x = f32::NEG_INFINITY;
            }
        }
    }

    fn draw(&self, draw: &Draw) -> candle_core::Result<u32> {
        let mut s: Vec<f32> = draw.logits().to_vec1()?;
        let mut seen = std::collections::HashSet::new();
        let previous = if self.flaw == Flaw::PenaltySkipped {
            &[][..]
        } else {
            draw.previous()
        };
        for &t in previous {
            if seen.insert(t) {
                if let Some(x) = s.get_mut(t as usize) {
                    *x = if *x < 0.0 {
                        *x * self.penalty
                    } else {
                        *x / self.penalty
                    };
                }
            }
        }
        let tempered = |s: &mut Vec<f32>| s.iter_mut().for_each(|x| *x /= self.temperature);
        if self.flaw != Flaw::TemperatureLast {
            tempered(&mut s);
        }
        let untruncated = s.clone();
        self.top_k(&mut s);
        self.top_p(&mut s);
        self.min_p(&mut s);
        if self.flaw == Flaw::TemperatureLast {
            tempered(&mut s);
        }
        let probs = match self.flaw {
            // The whole vocabulary's probabilities, zero where truncated: not renormalised.
            Flaw::Unnormalised => Self::softmax(&untruncated)
                .into_iter()
                .zip(&s)
                .map(|(p, x)| if x.is_finite() { p } else { 0.0 })
                .collect(),
            _ => Self::softmax(&s),
        };
        if self.flaw == Flaw::SameTokenEveryTime {
            let best = (0..probs.len())
                .max_by(|&a, &b| probs[a].total_cmp(&probs[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            return Ok(best as u32);
        }
        let total: f64 = probs.iter().map(|&p| f64::from(p)).sum();
        let target = match self.flaw {
            Flaw::Unnormalised => draw.uniform(),
            _ => draw.uniform() * total,
        };
        let mut acc = 0f64;
        let mut last = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                last = i;
                acc += f64::from(p);
                if acc > target {
                    return Ok(i as u32);
                }
            }
        }
        Ok(last as u32)
    }
}

fn uniform_sampler(flaw: Flaw) -> impl Fn() -> BoxedSampler + Clone + Send + Sync + 'static {
    move || {
        let sampler = UniformSampler::new(flaw);
        Box::new(move |draw: &Draw| sampler.draw(draw))
    }
}

#[test]
fn a_sampler_taking_golden_s_uniforms_draws_transformers_tokens_exactly() {
    let layer = sampled_llama("sampled_llama_exact", full());
    let report = check(&layer, port(uniform_sampler(Flaw::None))).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("the sampler takes golden's uniforms and draws transformers' tokens, every one (checked exactly)"),
        "{snapshot}"
    );
    assert!(
        snapshot.contains(
            "free-running, the port draws the reference's sampled tokens with golden's uniforms"
        ),
        "{snapshot}"
    );
}

/// candle-transformers' `LogitsProcessor` after its `apply_repeat_penalty`, drawing with its own
/// generator (seeded: the same draws every run).
fn candle_sampler(
    sampling: CandleSampling,
    penalty: Option<f32>,
) -> impl Fn() -> BoxedSampler + Clone + Send + Sync + 'static {
    move || {
        let mut processor = LogitsProcessor::from_sampling(299_792_458, sampling.clone());
        Box::new(move |draw: &Draw| {
            let logits = match penalty {
                Some(p) => candle_transformers::utils::apply_repeat_penalty(
                    draw.logits(),
                    p,
                    draw.previous(),
                )?,
                None => draw.logits().clone(),
            };
            processor.sample(&logits)
        })
    }
}

#[test]
fn candle_transformers_logits_processor_draws_in_distribution() {
    let sampling = Sampling::new()
        .temperature(0.7)
        .top_p(0.9)
        .repetition_penalty(1.3);
    let layer = sampled_llama("sampled_llama_candle_top_p", sampling);
    let candle = candle_sampler(
        CandleSampling::TopP {
            p: 0.9,
            temperature: 0.7,
        },
        Some(1.3),
    );
    let report = check(&layer, port(candle)).unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("the sampler draws its own random numbers: checked in distribution"),
        "{snapshot}"
    );
}

fn must_fail(
    name: &str,
    sampling: Sampling,
    port: impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String>
        + Clone
        + Send
        + Sync
        + 'static,
) -> String {
    let layer = sampled_llama(name, sampling);
    match check(&layer, port) {
        Ok(_) => panic!("the wrong sampler `{name}` passed"),
        Err(f) => {
            let msg = f.to_string();
            println!("{msg}");
            assert!(
                msg.contains("step by step, but its sampler does not draw as transformers' does"),
                "{msg}"
            );
            msg
        }
    }
}

fn wrong(name: &str, flaw: Flaw) -> String {
    must_fail(name, full(), port(uniform_sampler(flaw)))
}

fn names(msg: &str, cause: &str) {
    assert!(
        msg.contains(&format!(
            "likely cause: the port draws as transformers' sampler does with {cause}"
        )),
        "{msg}"
    );
    assert!(
        msg.contains("the smallest logits vector that shows it: logits ["),
        "{msg}"
    );
}

#[test]
fn temperature_applied_after_the_truncation_is_named() {
    let msg = wrong("sampled_wrong_temperature_last", Flaw::TemperatureLast);
    names(&msg, "the temperature applied after top-k/top-p/min-p");
}

#[test]
fn top_p_dropping_the_crossing_token_is_named() {
    let msg = wrong("sampled_wrong_top_p_drops", Flaw::TopPDropsCrossing);
    names(
        &msg,
        "top-p dropping the token whose cumulative probability crosses p",
    );
}

#[test]
fn top_p_keeping_a_token_past_the_crossing_one_is_named() {
    let msg = wrong("sampled_wrong_top_p_keeps", Flaw::TopPKeepsOneMore);
    names(&msg, "top-p keeping one token past the one that crosses p");
}

#[test]
fn top_k_ties_broken_by_index_are_named_on_golden_s_probe() {
    let layer = sampled_llama("sampled_wrong_top_k_ties", full());
    let msg = match check(&layer, port(uniform_sampler(Flaw::TopKTiesByIndex))) {
        Ok(_) => panic!("the wrong sampler `sampled_wrong_top_k_ties` passed"),
        Err(f) => f.to_string(),
    };
    println!("{msg}");
    // With parameters drawn at unit gain (#31 item 16) this seed's smallest failing case is found
    // free-running, on the model's own logits (a prompt of zeros: tied logits, whose order the
    // port's rounding decides), before the probe: caught, not named there. Where the probe finds
    // it, the tie rule is named.
    if msg.contains("does not draw as transformers does on golden's probe") {
        names(
            &msg,
            "top-k keeping exactly k tokens, ties with the k-th broken by index",
        );
    } else {
        assert!(msg.contains("free-running, at generated token"), "{msg}");
    }
}

#[test]
fn a_processor_skipped_is_named() {
    let msg = wrong("sampled_wrong_penalty_skipped", Flaw::PenaltySkipped);
    names(&msg, "the repetition penalty not applied");
}

#[test]
fn an_unnormalised_distribution_is_named() {
    let msg = wrong("sampled_wrong_unnormalised", Flaw::Unnormalised);
    names(
        &msg,
        "a draw on truncated probabilities that were not renormalised",
    );
}

#[test]
fn the_same_token_every_time_is_named() {
    let msg = wrong("sampled_wrong_same_token", Flaw::SameTokenEveryTime);
    names(&msg, "the same token every time");
}

#[test]
fn candle_transformers_top_k_then_top_p_is_caught_in_distribution() {
    let sampling = Sampling::new().temperature(0.7).top_k(8).top_p(0.9);
    let candle = candle_sampler(
        CandleSampling::TopKThenTopP {
            k: 8,
            p: 0.9,
            temperature: 0.7,
        },
        None,
    );
    let msg = must_fail("sampled_candle_top_k_then_top_p", sampling, port(candle));
    // On golden's probe (whole-number logits), its top-k keeps exactly 8 of the tokens tied with
    // the 8th (`select_nth_unstable`: which ones is an accident of the partial sort), and its
    // top-p sums the whole vocabulary's probabilities after top-k where transformers renormalises
    // over the tokens kept: it draws tokens transformers removed. Two mistakes at once: no single
    // one golden knows explains its draws, and the failure says so.
    // On the model's logits or on golden's probe, whichever the smallest failing case shows.
    assert!(
        msg.contains("on golden's probe (whole-number logits: ties)")
            || msg.contains("on the model's logits of generated token"),
        "{msg}"
    );
    assert!(msg.contains("in distribution, over "), "{msg}");
    assert!(
        msg.contains(
            "it draws tokens transformers cannot draw (probability 0 after its processors)"
        ),
        "{msg}"
    );
}

/// The distribution test's false-alarm rate, measured (`cargo xtask bench-sampling`): a right
/// sampler (the one above, drawing with fresh uniforms of its own per seed) tested against
/// transformers' probabilities on one logits vector, once per seed for 1,000 seeds, each test with
/// the draws `judge/distribution.rs` asks; the rate of failures beside the stated one (and at two
/// larger nominal rates, by the tests' p-values, where 1,000 seeds say more), and the time.
#[test]
#[ignore = "a benchmark: cargo xtask bench-sampling"]
fn false_alarm_rate() {
    use golden::internal::judge::distribution;
    let python = golden::internal::describe::env::python().program;
    let mut rng = golden::internal::describe::rng::Rng::new(1, "bench-sampling");
    let logits: Vec<f32> = rng
        .normals(tiny_llama::VOCAB)
        .iter()
        .map(|z| (0.8 * z) as f32)
        .collect();
    let previous: Vec<u32> = vec![3, 7, 7, 12];
    let script = format!(
        "import json, torch\nfrom golden_ref.sampling import process\n\
         r = process(torch.tensor([{logits:?}]), torch.tensor([{previous:?}]), \
         torch.zeros(1, 1, dtype=torch.float64), temperature=0.7, top_k=8, top_p=0.9, \
         min_p=0.05, repetition_penalty=1.3)\nprint(json.dumps(r['probs'][0].tolist()))"
    );
    let out = std::process::Command::new(&python)
        .env(
            "PYTHONPATH",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../reference_py"),
        )
        .args(["-c", &script])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probs: Vec<f64> = serde_json::from_slice(&out.stdout).expect("probabilities");
    let draws = distribution::draws_needed(&probs) as usize;
    let sampler = UniformSampler::new(Flaw::None);
    let tensor = Tensor::new(logits.as_slice(), &Device::Cpu).unwrap();
    let seeds = 1_000u64;
    let started = std::time::Instant::now();
    let mut p_values = Vec::new();
    for seed in 0..seeds {
        let mut u = golden::internal::describe::rng::Rng::new(seed, "bench-sampling.draws");
        let mut counts = vec![0u64; probs.len()];
        for _ in 0..draws {
            let draw = Draw::new(tensor.clone(), previous.clone(), u.unit());
            counts[sampler.draw(&draw).unwrap() as usize] += 1;
        }
        let fit = distribution::goodness_of_fit(&probs, &counts);
        assert!(
            fit.impossible.is_empty(),
            "a right sampler drew an impossible token"
        );
        p_values.push(fit.p_value);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let kept: Vec<f64> = probs.iter().copied().filter(|p| *p > 0.0).collect();
    let vocab = tiny_llama::VOCAB;
    eprintln!(
        "bench-sampling: transformers' probabilities ({} tokens kept of {vocab}; temperature 0.7, \
         top-k 8, top-p 0.9, min-p 0.05, repetition penalty 1.3); {draws} draws per test \
         (false-alarm rate {}, a difference of {} in total variation missed at most {} of the \
         time)",
        kept.len(),
        distribution::FALSE_ALARM,
        distribution::SMALLEST_DIFFERENCE,
        distribution::MISSED
    );
    for alpha in [distribution::FALSE_ALARM, 0.01, 0.05] {
        let failed = p_values.iter().filter(|&&p| p < alpha).count();
        let expected = alpha * seeds as f64;
        // The 95% range of a right sampler's failures: binomial, normal approximation.
        let spread = 1.96 * (seeds as f64 * alpha * (1.0 - alpha)).sqrt();
        eprintln!(
            "bench-sampling: at a rate of {alpha}: {failed} of {seeds} right samplers failed \
             (expected {expected:.1}, 95% range {:.1}..{:.1})",
            (expected - spread).max(0.0),
            expected + spread
        );
    }
    eprintln!(
        "bench-sampling: {seeds} tests of {draws} draws in {elapsed:.2} s ({:.2} ms per test, \
         the sampler's draws included)",
        1000.0 * elapsed / seeds as f64
    );
}
