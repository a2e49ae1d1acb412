//! The speed of a run's checks against a base's, for `golden report --markdown --base`: each
//! figure the results hold (a check's whole call, each trace point of a whole model, a
//! schedule's prefill and decode), as the port's time over the reference's, and whether it moved
//! beyond the noise its runs measured — this run's range (the port's lower quartile over the
//! reference's upper one, to its upper quartile over their lower one) and the base's do not
//! overlap (`golden::internal::judge::speed::Ratio::moved_from`). A ratio, not seconds: the two
//! runs need not be on the same machine. Never a failure: timings on shared machines are noisy,
//! so the summary lists a move only when the runs of both agree on it.

use golden::internal::judge::speed::{Ratio, Speed};
use serde_json::Value as Json;

/// A figure of a check whose speed moved against the base.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedMove {
    /// The dtype timed.
    pub dtype: String,
    /// What: `the whole call`, a trace point's name, `prefill`, `decode`.
    pub what: String,
    /// Whether `what` is a trace point's name.
    pub point: bool,
    /// The port over the reference in the base.
    pub before: Ratio,
    /// In this run.
    pub after: Ratio,
    /// After over before, medians (above 1: slower beside the reference than on the base).
    pub factor: f64,
    /// Timed runs per side: the base's, this run's.
    pub runs: (usize, usize),
}

/// The speed figures of a results file (`speed`: one per dtype timed).
pub fn read(doc: &Json) -> Vec<Speed> {
    doc["speed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Speed::from_json)
        .collect()
}

/// Each figure of a timed dtype: (what, whether a point, its ratio).
fn figures(s: &Speed) -> Vec<(String, bool, Ratio)> {
    let mut out = Vec::new();
    if let Some(r) = s.ratio() {
        out.push(("the whole call".to_string(), false, r));
    }
    for p in &s.points {
        if let Some(r) = p.ratio() {
            out.push((p.name.clone(), true, r));
        }
    }
    for (what, phase) in [("prefill", &s.prefill), ("decode", &s.decode)] {
        if let Some(r) = phase.as_ref().and_then(|p| p.ratio()) {
            out.push((what.to_string(), false, r));
        }
    }
    out
}

/// How many figures the two runs both have (compared), and those that moved, the most moved
/// (slower or faster) first.
pub fn moves(base: &[Speed], head: &[Speed]) -> (usize, Vec<SpeedMove>) {
    let mut compared = 0;
    let mut out = Vec::new();
    for after in head {
        let Some(before) = base.iter().find(|b| b.dtype == after.dtype) else {
            continue;
        };
        let then = figures(before);
        for (what, point, ratio) in figures(after) {
            let Some((_, _, old)) = then.iter().find(|(w, p, _)| *w == what && *p == point) else {
                continue;
            };
            compared += 1;
            if let Some(factor) = ratio.moved_from(old) {
                out.push(SpeedMove {
                    dtype: after.dtype.clone(),
                    what,
                    point,
                    before: *old,
                    after: ratio,
                    factor,
                    runs: (before.port.seconds.runs, after.port.seconds.runs),
                });
            }
        }
    }
    let size = |f: f64| if f >= 1.0 { f } else { 1.0 / f };
    out.sort_by(|a, b| size(b.factor).total_cmp(&size(a.factor)));
    (compared, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn speed(whole: [f64; 3], block: [f64; 3]) -> Speed {
        let spread =
            |m: f64, lo: f64, hi: f64| json!({"median": m, "min": lo, "max": hi, "runs": 5});
        Speed::from_json(&json!({
            "dtype": "f32",
            "case": "b=1:declared:0x1",
            "port": {"seconds": spread(whole[0], whole[1], whole[2])},
            "reference": {"seconds": spread(1.0, 0.95, 1.05)},
            "points": [{
                "point": "blocks.2", "depth": 0,
                "port": spread(block[0], block[1], block[2]),
                "reference": spread(0.1, 0.095, 0.105),
            }],
        }))
        .unwrap()
    }

    #[test]
    fn a_figure_moves_only_beyond_both_runs_noise() {
        let base = [speed([2.0, 1.9, 2.1], [0.2, 0.19, 0.21])];
        // Block 2 twice as slow; the whole call within the noise of both runs.
        let head = [speed([2.1, 1.9, 2.3], [0.4, 0.38, 0.42])];
        let (compared, moved) = moves(&base, &head);
        assert_eq!(compared, 2);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!((moved[0].what.as_str(), moved[0].point), ("blocks.2", true));
        assert!((moved[0].factor - 2.0).abs() < 1e-9);
        // The same run again: nothing moved.
        assert!(moves(&base, &base).1.is_empty());
    }
}
