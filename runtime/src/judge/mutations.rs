//! Naming the bug by mutating the reference: which mutants of the reference (the reference with one
//! of its torch calls turned into a porting mistake, `reference_py/golden_ref/mutations.py`)
//! the port matches.
//!
//! The rule is the check's own: the port must match the mutant within the comparison's tolerance,
//! the mutant evaluated like a reference (its outputs in the case dtype and its own rounding
//! estimate). And the mutant must differ from the reference on that case, within the reference's
//! tolerance: a mutation that changes nothing explains nothing. A mutant is a cause only when it
//! fits on two failing cases, the smallest and another ([`both`]); on one alone it is evidence.

use crate::describe::layer::Tol;
use crate::judge::compare::{self, Expected, Verdict};
use golden_files::HostTensor;

/// How closely the port matches a mutant on one case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The largest `|port − mutant| / allowed` over every element of every leaf (below 1).
    pub worst_ratio: f64,
    /// The largest `|port − mutant|`.
    pub max_diff: f64,
}

/// A mutant of the reference that the port matches.
#[derive(Clone, Debug, PartialEq)]
pub struct MutationMatch {
    /// Identifies the mutation across cases: the kind, its option and the call site.
    pub key: String,
    /// The mutated call, e.g. `F.gelu(approximate='tanh')`.
    pub what: String,
    /// What the reference does instead, e.g. `approximate='none'`.
    pub instead: String,
    /// Where, in the reference's source (`file:line`, relative to its import root or
    /// site-packages); empty for a mutation of the inputs.
    pub site: String,
    /// The fix, in candle terms.
    pub fix: String,
    /// Its family (`drop`, `boundary`, `constant`, `structure`, …).
    pub kind: String,
    /// The reference's source line at the site, when it is known.
    pub code: Option<String>,
    /// The fit (the worse of the two cases when both were examined).
    pub fit: Fit,
    /// Whether it fitted on two failing cases (the smallest and another), not one.
    pub both_cases: bool,
    /// A second mistake: matched on the other failing case only, made together with the first
    /// (whose claim this is), which alone matched the smallest case. The first then reads as a
    /// cause on both cases.
    pub second: Option<String>,
}

impl MutationMatch {
    /// What the match says the port does, with where: "the port matches the reference with WHAT at
    /// SITE (instead of INSTEAD)"; for a configuration mistake "the port behaves as if `FIELD`
    /// were VALUE (the config says VALUE), read at SITE".
    pub fn claim(&self) -> String {
        if self.kind == "config" {
            let site = if self.site.is_empty() {
                String::new()
            } else {
                format!(", read at {}", self.site)
            };
            return format!(
                "the port behaves as if {} (the config says {}){site}",
                self.what, self.instead
            );
        }
        let site = if self.site.is_empty() {
            String::new()
        } else {
            format!(" at {}", self.site)
        };
        let instead = if self.instead.is_empty() || self.what.contains(" instead of ") {
            String::new()
        } else {
            format!(" (instead of {})", self.instead)
        };
        format!(
            "the port matches the reference with {}{site}{instead}",
            self.what
        )
    }
}

/// Whether the port matches a mutant on a case: `Some` with the fit when it matches within the
/// check's tolerance and the mutant is not itself within tolerance of the reference. Leaves the
/// mutant does not have (trace points) are not compared.
pub fn fit(
    port: &[(String, HostTensor)],
    mutant: &[(String, Expected<'_>)],
    reference: &[(String, Expected<'_>)],
    tol: Option<Tol>,
    factor: f64,
) -> Option<Fit> {
    if mutant.is_empty() {
        return None;
    }
    let port: Vec<(String, HostTensor)> = port
        .iter()
        .filter(|(n, _)| mutant.iter().any(|(m, _)| m == n))
        .cloned()
        .collect();
    let leaves = compare::compare_all(&port, mutant, tol, factor);
    if !leaves.iter().all(compare::Leaf::passes) {
        return None;
    }
    // The mutant as the "port" against the reference: if it passes, this case cannot tell it from
    // the reference.
    let mutant_values: Vec<(String, HostTensor)> = mutant
        .iter()
        .map(|(n, e)| (n.clone(), e.value.clone()))
        .collect();
    let reference: Vec<(String, Expected<'_>)> = reference
        .iter()
        .filter(|(n, _)| mutant.iter().any(|(m, _)| m == n))
        .map(|(n, e)| {
            (
                n.clone(),
                Expected {
                    value: e.value,
                    rounding: e.rounding,
                    precise: None,
                },
            )
        })
        .collect();
    let against_reference = compare::compare_all(&mutant_values, &reference, tol, factor);
    if against_reference.iter().all(compare::Leaf::passes) {
        return None;
    }
    let mut fit = Fit {
        worst_ratio: 0.0,
        max_diff: 0.0,
    };
    for leaf in &leaves {
        if let Verdict::Values(v) = &leaf.verdict {
            fit.worst_ratio = fit.worst_ratio.max(v.worst_ratio);
            if let Some(g) = &v.greatest_abs {
                fit.max_diff = fit.max_diff.max(g.diff);
            }
        }
    }
    Some(fit)
}

/// The matches of the smallest case that also matched on another failing case (by key), each
/// with the worse of its two fits; in the worker's order, at most `limit`. When none did (or there is no
/// other case), the smallest case's matches, as evidence (`both_cases` false): the smallest case
/// is explained first, and a mistake that reproduces it is never dropped because another case
/// shows more than it (a port with two mistakes).
pub fn both(
    smallest: Vec<MutationMatch>,
    first: Option<&[MutationMatch]>,
    limit: usize,
) -> Vec<MutationMatch> {
    let confirmed: Vec<MutationMatch> = first
        .map(|first| {
            smallest
                .iter()
                .filter_map(|m| {
                    let other = first.iter().find(|f| f.key == m.key)?;
                    let mut m = m.clone();
                    m.fit.worst_ratio = m.fit.worst_ratio.max(other.fit.worst_ratio);
                    m.fit.max_diff = m.fit.max_diff.max(other.fit.max_diff);
                    m.both_cases = true;
                    Some(m)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = if confirmed.is_empty() {
        smallest
    } else {
        confirmed
    };
    // In the worker's order: those that reproduce the port to rounding in the order they were
    // tried, the same in every kind of check (which of them fits best is rounding's choice).
    // Two spellings of one mutant (eps ÷10 and eps=1e-6) read the same: keep the best.
    let mut seen = Vec::new();
    out.retain(|m| {
        let said = (m.what.clone(), m.site.clone());
        let new = !seen.contains(&said);
        seen.push(said);
        new
    });
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> HostTensor {
        HostTensor::from_floats(
            vec![values.len()],
            &values.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            golden_files::WireDType::F32,
        )
    }

    fn expected(t: &HostTensor) -> Vec<(String, Expected<'_>)> {
        vec![(
            "out".into(),
            Expected {
                value: t,
                rounding: None,
                precise: None,
            },
        )]
    }

    #[test]
    fn a_mutant_fits_when_the_port_matches_it_and_it_differs_from_the_reference() {
        let reference = f32s(&[1.0, 2.0, 3.0]);
        let mutant = f32s(&[1.5, 2.0, 3.0]);
        let port = vec![("out".to_string(), f32s(&[1.5, 2.0, 3.0]))];
        let fit = fit(&port, &expected(&mutant), &expected(&reference), None, 16.0);
        assert_eq!(fit.map(|f| f.max_diff), Some(0.0));
    }

    #[test]
    fn a_mutant_that_changes_nothing_explains_nothing() {
        let reference = f32s(&[1.0, 2.0, 3.0]);
        let port = vec![("out".to_string(), f32s(&[1.0, 2.0, 3.0]))];
        assert_eq!(
            fit(
                &port,
                &expected(&reference),
                &expected(&reference),
                None,
                16.0
            ),
            None
        );
    }

    #[test]
    fn a_mutant_the_port_does_not_match_does_not_fit() {
        let reference = f32s(&[1.0, 2.0, 3.0]);
        let mutant = f32s(&[1.5, 2.0, 3.0]);
        let port = vec![("out".to_string(), f32s(&[1.25, 2.0, 3.0]))];
        assert_eq!(
            fit(&port, &expected(&mutant), &expected(&reference), None, 16.0),
            None
        );
    }

    fn matched(key: &str, worst: f64) -> MutationMatch {
        MutationMatch {
            key: key.into(),
            what: key.into(),
            instead: String::new(),
            site: String::new(),
            fix: String::new(),
            kind: "drop".into(),
            code: None,
            fit: Fit {
                worst_ratio: worst,
                max_diff: 0.0,
            },
            both_cases: false,
            second: None,
        }
    }

    #[test]
    fn both_cases_keep_the_common_matches_in_order() {
        let smallest = vec![matched("a", 0.5), matched("b", 0.1), matched("c", 0.2)];
        let first = vec![matched("c", 0.6), matched("a", 0.1)];
        let kept = both(smallest, Some(&first), 3);
        let keys: Vec<&str> = kept.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!(kept[0].fit.worst_ratio, 0.5);
        assert_eq!(kept[1].fit.worst_ratio, 0.6);
        assert!(kept.iter().all(|m| m.both_cases));
    }

    #[test]
    fn the_smallest_case_s_matches_stay_as_evidence_when_the_other_confirms_none() {
        // A port with two mistakes: the other case shows both, so the mistake that reproduces the
        // smallest case matches there alone; it is evidence, not dropped.
        let smallest = vec![matched("a", 0.5), matched("b", 0.1)];
        let kept = both(smallest, Some(&[]), 3);
        let keys: Vec<&str> = kept.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert!(kept.iter().all(|m| !m.both_cases));
    }
}
