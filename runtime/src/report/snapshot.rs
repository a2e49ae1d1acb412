//! The text of a check's insta snapshot.
//!
//! It records what a reviewer needs to see change: the reference, the inputs, the tolerance, and
//! per leaf how far the port is from the reference over all cases — bucketed by decade, so the file
//! is byte-stable run to run while a ten-fold change in error (or any change of tolerance, shapes
//! or reference) shows as a diff in the pull request.
//!
//! The assertion itself is expanded in the user's crate by the macro (insta attributes a snapshot to
//! the code that expands `assert_snapshot!`); this module only builds the text.

use crate::describe::inputs::CaseParams;
use crate::describe::layer::dtype_name;
use crate::describe::layer::Layer;
use crate::describe::numbers::num;
use crate::judge::compare::{Leaf, Rule, Verdict};
use crate::report::passed::Report;
use std::fmt::Write as _;

/// The decade containing `x`, e.g. `1e-7..1e-6`; `0` for zero.
pub fn decade(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return format!("{x}");
    }
    let mut e = x.abs().log10().floor() as i32;
    // log10 is not exact at powers of ten: settle the boundary with an exact comparison.
    if 10f64.powi(e + 1) <= x.abs() {
        e += 1;
    } else if 10f64.powi(e) > x.abs() {
        e -= 1;
    }
    format!("1e{}..1e{}", e, e + 1)
}

/// The symbolic shape of a leaf across cases: an axis is the dim it always equals, else its size if
/// constant, else `?`.
fn symbolic_shape(layer: &Layer, shapes: &[(Vec<usize>, &CaseParams)]) -> String {
    let Some((first, _)) = shapes.first() else {
        return "[]".into();
    };
    if shapes.iter().any(|(s, _)| s.len() != first.len()) {
        return "(rank varies)".into();
    }
    let axes: Vec<String> = (0..first.len())
        .map(|axis| {
            let sym = layer.dims.iter().find(|d| {
                shapes
                    .iter()
                    .all(|(s, case)| case.dim(&d.name) == Some(s[axis]))
            });
            match sym {
                Some(d) => d.name.clone(),
                None if shapes.iter().all(|(s, _)| s[axis] == first[axis]) => {
                    first[axis].to_string()
                }
                None => "?".into(),
            }
        })
        .collect();
    format!("[{}]", axes.join(", "))
}

fn describe_rule(rule: &Rule) -> String {
    match rule {
        Rule::Default { atol, rtol, factor } if *factor > 0.0 => format!(
            "golden default: atol {} + rtol {}·|ref| + {} × rounding estimate",
            num(*atol),
            num(*rtol),
            num(*factor)
        ),
        Rule::Default { atol, rtol, .. } => format!(
            "assert_close default: atol {} + rtol {}·|ref| (no float64 evaluation)",
            num(*atol),
            num(*rtol)
        ),
        other => other.to_string(),
    }
}

impl Report {
    /// The snapshot's name: [`Layer::check_name`], and for the other kinds of check their suffix
    /// (`norms__layer_norm__gradients`).
    pub fn snapshot_name(&self) -> String {
        format!("{}{}", self.layer.check_name(), self.kind.suffix())
    }

    /// The snapshot text; `None` when the declared cases did not all run (see
    /// [`Report::snapshot_skipped`]).
    pub fn snapshot(&self) -> Option<String> {
        if self.snapshot_skipped().is_some() {
            return None;
        }
        Some(self.snapshot_text())
    }

    /// Why the snapshot, which describes the declared cases, is not compared this time.
    pub fn snapshot_skipped(&self) -> Option<&'static str> {
        if self.overridden {
            Some("GOLDEN_SEED, GOLDEN_CASES or GOLDEN_CASE changed the cases")
        } else if self.runs.iter().any(|r| r.skipped > 0) {
            Some("the golden store it replayed holds only some of the cases (its size bound)")
        } else {
            None
        }
    }

    fn snapshot_text(&self) -> String {
        let mut s = self.description.clone();
        for run in &self.runs {
            let _ = writeln!(s, "{}:", dtype_name(run.dtype));
            self.write_leaves(&mut s, &run.cases);
            Self::write_figures(&mut s, &run.cases);
        }
        if self.kind == crate::describe::checks::Kind::Overfit {
            if self.health.is_empty() {
                let _ = writeln!(s, "gradient health: ok");
            }
            for h in &self.health {
                let _ = writeln!(s, "gradient health: {h}");
            }
        }
        s
    }

    /// Figures of the kind of check (finite-difference errors), each the largest over the cases.
    fn write_figures(s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
        let mut names: Vec<&str> = Vec::new();
        for (name, _) in cases.iter().flat_map(|c| &c.figures) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        for name in names {
            let max = cases
                .iter()
                .flat_map(|c| &c.figures)
                .filter(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .fold(0.0f64, f64::max);
            let what = if let Some(input) = name.strip_prefix("fd.") {
                format!("finite differences, {input}: |analytic - numeric| / tolerance")
            } else if let Some(step) = name.strip_prefix("loss.") {
                format!("port's loss, {step}")
            } else if name == "parity.loss" {
                "loss, |port - PyTorch| / |PyTorch|, worst step".to_string()
            } else if name == "parity.update" {
                "update (final - initial weights), |port - PyTorch| / |PyTorch|, worst parameter"
                    .to_string()
            } else {
                name.to_string()
            };
            let _ = writeln!(s, "  {what}: {}", decade(max));
        }
    }

    fn write_leaves(&self, s: &mut String, cases: &[crate::report::passed::CaseRecord]) {
        let Some(first) = cases.first() else {
            let _ = writeln!(s, "  (no cases)");
            return;
        };
        let mut trace_header = false;
        for (i, leaf) in first.leaves.iter().enumerate() {
            let all: Vec<&Leaf> = cases.iter().filter_map(|c| c.leaves.get(i)).collect();
            let shapes: Vec<(Vec<usize>, &CaseParams)> = cases
                .iter()
                .filter_map(|c| {
                    c.leaves
                        .get(i)
                        .and_then(|l| l.reference.as_ref().map(|r| (r.0.clone(), &c.params)))
                })
                .collect();
            let dtype = leaf.reference.as_ref().map(|r| r.1.name()).unwrap_or("?");
            let values: Vec<&crate::judge::compare::Values> = all
                .iter()
                .filter_map(|l| match &l.verdict {
                    Verdict::Values(v) => Some(&**v),
                    _ => None,
                })
                .collect();
            let figures = |values: &[&crate::judge::compare::Values]| {
                let max_abs = values
                    .iter()
                    .filter_map(|v| v.greatest_abs.as_ref().map(|g| g.diff))
                    .fold(0.0f64, f64::max);
                let worst = values.iter().map(|v| v.worst_ratio).fold(0.0f64, f64::max);
                (decade(max_abs), decade(worst))
            };
            // Trace points: one line each, the drift against depth read top to bottom.
            if let (Some(point), Some(v0)) = (
                leaf.name.strip_prefix(crate::judge::trace::PREFIX),
                values.first(),
            ) {
                if !trace_header {
                    trace_header = true;
                    let _ = writeln!(
                        s,
                        "  trace, in the reference's execution order (tolerance: {}):",
                        describe_rule(&v0.rule)
                    );
                }
                let (max_abs, worst) = figures(&values);
                let _ = writeln!(
                    s,
                    "    {point} {dtype} {}: max |port - ref| {max_abs}, error / allowed {worst}",
                    symbolic_shape(&self.layer, &shapes)
                );
                continue;
            }
            let _ = writeln!(
                s,
                "  {} {dtype} {}",
                leaf.name,
                symbolic_shape(&self.layer, &shapes)
            );
            let Some(v0) = values.first() else { continue };
            let _ = writeln!(s, "    tolerance: {}", describe_rule(&v0.rule));
            if v0.rule == Rule::Exact {
                let _ = writeln!(s, "    equal in every case");
                continue;
            }
            let (max_abs, worst) = figures(&values);
            let _ = writeln!(s, "    max |port - ref|: {max_abs}");
            let _ = writeln!(s, "    max error / allowed: {worst}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decades_are_exact_at_powers_of_ten() {
        assert_eq!(decade(1e-6), "1e-6..1e-5");
        assert_eq!(decade(9.99e-7), "1e-7..1e-6");
        assert_eq!(decade(1e-3), "1e-3..1e-2");
        assert_eq!(decade(0.0), "0");
        // A ten-fold change always moves to another bucket.
        for x in [1.3e-7, 4.2e-5, 0.7, 55.0] {
            assert_ne!(decade(x), decade(10.0 * x));
        }
    }

    #[test]
    fn names_drop_the_crate_and_end_with_the_layer() {
        let declared = |module_path| crate::describe::layer::Declared {
            module_path,
            ..crate::declared!()
        };
        let layer = |m| Layer::function("gelu", "m.f").declared_at(declared(m));
        assert_eq!(
            layer("golden_zoo::activations::gelu").check_name(),
            "activations__gelu"
        );
        assert_eq!(layer("wrong_ports").check_name(), "gelu");
        assert_eq!(Layer::function("gelu", "m.f").check_name(), "gelu");
    }
}
