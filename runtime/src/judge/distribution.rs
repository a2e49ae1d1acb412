//! Whether a sampler's draws come from the reference's probabilities: a goodness-of-fit test
//! whose false-alarm rate is stated, and whose number of draws follows from it and from the
//! smallest difference worth catching.
//!
//! A sampler that draws its own random numbers (candle-transformers' `LogitsProcessor`) cannot draw
//! the reference's tokens; what it must get right is how often it draws each. golden draws from it
//! many times on one logits vector and tests the counts against the reference's probabilities:
//!
//! - a token the reference cannot draw (probability exactly 0 after its processors) drawn even once
//!   fails outright: no right sampler ever does that;
//! - the other tokens are cells of Pearson's chi-square test, each token whose expected count is
//!   at least [`MIN_EXPECTED`] a cell of its own, the rarer ones pooled into one cell; the test
//!   fails when its p-value is below [`FALSE_ALARM`]: a right sampler fails it one time in a
//!   thousand, by chance (`cargo xtask bench-sampling` measures the rate over 1,000 seeds);
//! - the number of draws is the smallest for which a sampler whose cells' probabilities differ
//!   from the reference's by [`SMALLEST_DIFFERENCE`] in total variation escapes the test at most
//!   [`MISSED`] of the time. Total variation δ bounds the chi-square distance from below (φ² ≥ 4δ²,
//!   Cauchy–Schwarz), so the test's statistic is a noncentral chi-square with noncentrality at
//!   least 4δ² times the draws; the draws solve P(χ²(df, λ) > critical value) = 1 − MISSED.

use statrs::distribution::{ChiSquared, ContinuousCDF};
use statrs::function::gamma::{gamma_ur, ln_gamma};

/// The stated false-alarm rate of one distribution test: a right sampler fails it with this
/// probability.
pub const FALSE_ALARM: f64 = 1e-3;

/// The smallest difference worth catching: the total variation between the cells' probabilities
/// of the sampler and of the reference.
pub const SMALLEST_DIFFERENCE: f64 = 0.05;

/// The chance that a sampler off by [`SMALLEST_DIFFERENCE`] passes.
pub const MISSED: f64 = 1e-3;

/// A cell's smallest expected count (rarer tokens are pooled).
pub const MIN_EXPECTED: f64 = 5.0;

/// The most draws one test makes.
pub const MAX_DRAWS: u64 = 200_000;

/// One cell of the test: a token, or the rare tokens pooled.
#[derive(Clone, Debug, PartialEq)]
pub struct CellFit {
    /// Its tokens (one, or the pooled ones).
    pub tokens: Vec<usize>,
    /// How many draws fell in it.
    pub observed: u64,
    /// How many the reference's probabilities expect.
    pub expected: f64,
}

impl CellFit {
    /// Its standardised residual, `(observed − expected) / √expected`.
    pub fn residual(&self) -> f64 {
        (self.observed as f64 - self.expected) / self.expected.sqrt()
    }

    /// `token 7` or `the 12 rarest tokens (3, 9, ...)`.
    pub fn name(&self) -> String {
        match self.tokens.as_slice() {
            [one] => format!("token {one}"),
            many => {
                let shown: Vec<String> = many.iter().take(6).map(ToString::to_string).collect();
                format!(
                    "the {} rarest tokens pooled ({}{})",
                    many.len(),
                    shown.join(", "),
                    if many.len() > 6 { ", ..." } else { "" }
                )
            }
        }
    }
}

/// The verdict of one distribution test.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// The draws counted.
    pub draws: u64,
    /// Tokens drawn that the reference cannot draw (probability 0), with their counts.
    pub impossible: Vec<(usize, u64)>,
    /// The cells.
    pub cells: Vec<CellFit>,
    /// Pearson's statistic.
    pub statistic: f64,
    /// Its degrees of freedom (cells − 1).
    pub df: usize,
    /// The p-value (1 with a single cell).
    pub p_value: f64,
}

impl Fit {
    /// Whether the draws are consistent with the probabilities at the stated false-alarm rate.
    pub fn passes(&self) -> bool {
        self.impossible.is_empty() && self.p_value >= FALSE_ALARM
    }

    /// The cells that differ most, worst first: those beyond 3.3 standard deviations (or the worst
    /// one), at most `n`.
    pub fn differing(&self, n: usize) -> Vec<&CellFit> {
        let mut cells: Vec<&CellFit> = self.cells.iter().collect();
        cells.sort_by(|a, b| b.residual().abs().total_cmp(&a.residual().abs()));
        let beyond = cells.iter().filter(|c| c.residual().abs() > 3.3).count();
        cells.truncate(beyond.max(1).min(n));
        cells
    }
}

/// The cells of `probs` at `draws` draws: each token whose expected count is at least
/// [`MIN_EXPECTED`] on its own, the rest pooled (into the smallest cell when the pool itself is
/// below it). Tokens of probability 0 are in no cell.
pub fn cells(probs: &[f64], draws: u64) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] > 0.0).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let n = draws as f64;
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut pool: Vec<usize> = Vec::new();
    for i in order {
        if probs[i] * n >= MIN_EXPECTED {
            out.push(vec![i]);
        } else {
            pool.push(i);
        }
    }
    if !pool.is_empty() {
        let mass: f64 = pool.iter().map(|&i| probs[i]).sum();
        match out.last_mut() {
            Some(smallest) if mass * n < MIN_EXPECTED => smallest.extend(pool),
            _ => out.push(pool),
        }
    }
    out
}

/// The chi-square distribution's survival function.
fn chi2_sf(x: f64, df: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    gamma_ur(df / 2.0, x / 2.0)
}

/// The noncentral chi-square distribution's survival function (a Poisson mixture of central
/// ones).
fn noncentral_sf(x: f64, df: f64, lambda: f64) -> f64 {
    let half = lambda / 2.0;
    if half == 0.0 {
        return chi2_sf(x, df);
    }
    let top = (half + 12.0 * half.sqrt() + 30.0).ceil() as u64;
    (0..=top)
        .map(|j| {
            let j = j as f64;
            let weight = (-half + j * half.ln() - ln_gamma(j + 1.0)).exp();
            weight * chi2_sf(x, df + 2.0 * j)
        })
        .sum::<f64>()
        .min(1.0)
}

/// The critical value of the test with `df` degrees of freedom at the stated false-alarm rate.
fn critical(df: usize) -> f64 {
    ChiSquared::new(df as f64)
        .map(|c| c.inverse_cdf(1.0 - FALSE_ALARM))
        .unwrap_or(f64::INFINITY)
}

/// The noncentrality at which the test catches a difference with probability `1 − MISSED`.
fn noncentrality_needed(df: usize) -> f64 {
    let c = critical(df);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while noncentral_sf(c, df as f64, hi) < 1.0 - MISSED && hi < 1e6 {
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if noncentral_sf(c, df as f64, mid) < 1.0 - MISSED {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// How many draws the test of `probs` makes: enough that a difference of
/// [`SMALLEST_DIFFERENCE`] between the cells escapes it at most [`MISSED`] of the time (and that
/// mass of that size on tokens the reference cannot draw shows in a draw), at most
/// [`MAX_DRAWS`].
pub fn draws_needed(probs: &[f64]) -> u64 {
    let delta = SMALLEST_DIFFERENCE;
    // Mass δ outside the reference's tokens shows in at least one of n draws but for MISSED.
    let outside = (MISSED.ln() / (1.0 - delta).ln()).ceil() as u64;
    let mut draws = 1_000u64;
    for _ in 0..4 {
        let df = cells(probs, draws).len().saturating_sub(1);
        let next = if df == 0 {
            outside
        } else {
            (noncentrality_needed(df) / (4.0 * delta * delta)).ceil() as u64
        };
        if next == draws {
            break;
        }
        draws = next.clamp(outside, MAX_DRAWS);
    }
    draws.clamp(outside, MAX_DRAWS)
}

/// Test the `counts` of a sampler's draws (one per token) against the reference's `probs`.
pub fn goodness_of_fit(probs: &[f64], counts: &[u64]) -> Fit {
    let draws: u64 = counts.iter().sum();
    let impossible: Vec<(usize, u64)> = counts
        .iter()
        .enumerate()
        .filter(|&(i, &c)| c > 0 && probs.get(i).is_none_or(|&p| p <= 0.0))
        .map(|(i, &c)| (i, c))
        .collect();
    let total: f64 = probs.iter().filter(|p| **p > 0.0).sum();
    let n = draws as f64;
    let cells: Vec<CellFit> = cells(probs, draws)
        .into_iter()
        .map(|tokens| CellFit {
            observed: tokens
                .iter()
                .map(|&i| counts.get(i).copied().unwrap_or(0))
                .sum(),
            expected: tokens.iter().map(|&i| probs[i]).sum::<f64>() / total * n,
            tokens,
        })
        .collect();
    let statistic: f64 = cells
        .iter()
        .map(|c| (c.observed as f64 - c.expected).powi(2) / c.expected)
        .sum();
    let df = cells.len().saturating_sub(1);
    let p_value = if df == 0 {
        1.0
    } else {
        chi2_sf(statistic, df as f64)
    };
    Fit {
        draws,
        impossible,
        cells,
        statistic,
        df,
        p_value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::rng::Rng;

    /// `n` draws from `probs` by inverse CDF with golden's generator.
    fn counts(probs: &[f64], n: u64, rng: &mut Rng) -> Vec<u64> {
        let mut counts = vec![0u64; probs.len()];
        let total: f64 = probs.iter().sum();
        for _ in 0..n {
            let target = rng.unit() * total;
            let mut acc = 0.0;
            let i = probs
                .iter()
                .position(|p| {
                    acc += p;
                    acc > target
                })
                .unwrap_or(probs.len() - 1);
            counts[i] += 1;
        }
        counts
    }

    #[test]
    fn the_chi_square_tail_is_the_textbook_one() {
        // Tables: the 0.999 quantile of χ²(1) is 10.828, of χ²(10) 29.588.
        assert!((critical(1) - 10.828).abs() < 1e-3, "{}", critical(1));
        assert!((critical(10) - 29.588).abs() < 1e-3, "{}", critical(10));
        assert!((chi2_sf(29.588, 10.0) - 1e-3).abs() < 1e-6);
        // Noncentral with λ = 0 is the central one; more noncentrality, more mass in the tail.
        assert!((noncentral_sf(10.0, 4.0, 0.0) - chi2_sf(10.0, 4.0)).abs() < 1e-12);
        assert!(noncentral_sf(10.0, 4.0, 5.0) > chi2_sf(10.0, 4.0));
    }

    #[test]
    fn draws_follow_from_the_rates_and_the_difference() {
        let uniform = vec![0.1; 10];
        let n = draws_needed(&uniform);
        // df 9 at α = β = 1e-3, δ = 0.05: λ ≈ 60–70, so a few thousand draws.
        assert!((4_000..10_000).contains(&n), "{n}");
        // A sampler off by δ in total variation, at those draws, is caught (nearly) always.
        let mut shifted = uniform.clone();
        shifted[0] += SMALLEST_DIFFERENCE;
        shifted[1] -= SMALLEST_DIFFERENCE;
        let mut rng = Rng::new(1, "shifted");
        let caught = (0..200)
            .filter(|_| !goodness_of_fit(&uniform, &counts(&shifted, n, &mut rng)).passes())
            .count();
        assert!(caught >= 198, "{caught} of 200");
        // One token that can be drawn: enough draws to see δ of mass elsewhere.
        assert_eq!(draws_needed(&[0.0, 1.0, 0.0]), 135);
    }

    #[test]
    fn a_right_sampler_fails_at_about_the_stated_rate() {
        // At a false-alarm rate of 1e-3 over 2,000 seeded runs 2 failures are expected: more
        // than 10 would say the test is not calibrated (P < 1e-4 for a right one).
        let probs = [0.5, 0.2, 0.15, 0.1, 0.04, 0.008, 0.002];
        let n = draws_needed(&probs);
        let mut rng = Rng::new(7, "calibration");
        let false_alarms = (0..2_000)
            .filter(|_| !goodness_of_fit(&probs, &counts(&probs, n, &mut rng)).passes())
            .count();
        assert!(false_alarms <= 10, "{false_alarms} false alarms in 2000");
    }

    #[test]
    fn an_impossible_token_fails_and_cells_name_what_differs() {
        let probs = [0.5, 0.5, 0.0];
        let fit = goodness_of_fit(&probs, &[50, 49, 1]);
        assert_eq!(fit.impossible, vec![(2, 1)]);
        assert!(!fit.passes());
        let fit = goodness_of_fit(&[0.5, 0.3, 0.2], &[500, 500, 0]);
        assert!(!fit.passes());
        let worst = fit.differing(3);
        assert_eq!(worst[0].name(), "token 2");
        assert_eq!((worst[0].observed, worst[0].expected), (0, 200.0));
        // Rare tokens are pooled.
        let c = cells(&[0.9, 0.05, 0.03, 0.02, 0.0], 100);
        assert_eq!(c, vec![vec![0], vec![1], vec![2, 3]]);
    }
}
