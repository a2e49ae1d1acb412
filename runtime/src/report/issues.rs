//! What the gradient, training and schedule checks find beyond their leaves' values, one enum per
//! check. Each prints as the failure message says it (`Display`), and the code asks an issue what
//! it is — the input a finite-difference finding is about, whether it is the forward that differs,
//! the likely cause it names — instead of reading its text back.

use crate::describe::inputs::CaseParams;
use std::fmt;

/// A finding of the gradient check (`run/gradients.rs`): a line under "the port's gradients:".
#[derive(Clone, Debug, PartialEq)]
pub enum GradientIssue {
    /// The port's forward already differs from the reference's on the case: its outputs that
    /// differ, each with its numbers (`` `out` (3 of 16 elements, up to 2.1× the tolerance) ``).
    /// Its gradients cannot match then; the headline says so, and this comes first.
    ForwardDiffers(Vec<String>),
    /// The port's backward disagrees with its own finite differences about one input or
    /// parameter.
    FiniteDifferences(FdDisagreement),
    /// A finding of another failing case that the smallest one does not show.
    OnAnotherCase {
        /// The case it showed on.
        case: CaseParams,
        /// What it showed.
        issue: Box<GradientIssue>,
    },
    /// The likely cause of the findings above it (printed after `likely cause: `).
    LikelyCause(String),
    /// Any other finding (a gradient PyTorch has and the port has not or the reverse, a backward
    /// that does not scale with the cotangent or is not deterministic, a port that fails in
    /// float64), as printed.
    Other(String),
}

impl GradientIssue {
    /// Whether this says that the port's forward differs on the case.
    pub fn is_forward_differs(&self) -> bool {
        matches!(self, GradientIssue::ForwardDiffers(_))
    }

    /// Whether this is a finite-difference disagreement found on this case (another case's is
    /// [`GradientIssue::OnAnotherCase`]).
    pub fn is_finite_differences(&self) -> bool {
        matches!(self, GradientIssue::FiniteDifferences(_))
    }

    /// The input or parameter a finite-difference disagreement is about, on this case or on
    /// another one.
    pub fn target(&self) -> Option<&str> {
        match self {
            GradientIssue::FiniteDifferences(d) => Some(&d.target),
            GradientIssue::OnAnotherCase { issue, .. } => issue.target(),
            _ => None,
        }
    }

    /// The likely cause this names, without its `likely cause: `.
    pub fn likely_cause(&self) -> Option<&str> {
        match self {
            GradientIssue::LikelyCause(cause) => Some(cause),
            _ => None,
        }
    }
}

impl fmt::Display for GradientIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GradientIssue::ForwardDiffers(outputs) => write!(
                f,
                "the forward differs too: the port's outputs {} differ from the reference's on \
                 this case, so the port computes another function and its gradients cannot match; \
                 fix the forward first (its forward check names the cause), then check the \
                 gradients again",
                outputs.join(", ")
            ),
            GradientIssue::FiniteDifferences(d) => write!(f, "{d}"),
            GradientIssue::OnAnotherCase { case, issue } => {
                write!(f, "on another failing case ({case}): {issue}")
            }
            GradientIssue::LikelyCause(cause) => write!(f, "likely cause: {cause}"),
            GradientIssue::Other(text) => f.write_str(text),
        }
    }
}

/// The port's analytic gradient of an input or parameter against its own finite differences:
/// `` `x`: ∂out[0]/∂x[1] is … in the port's backward, … by finite differences … ``.
#[derive(Clone, Debug, PartialEq)]
pub struct FdDisagreement {
    /// The input or parameter.
    pub target: String,
    /// What disagrees, with the numbers (printed after `` `target`: ``).
    pub finding: String,
}

impl fmt::Display for FdDisagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.target, self.finding)
    }
}

/// A finding of the overfit check (`run/overfit.rs`): a line under "the training:".
#[derive(Clone, Debug, PartialEq)]
pub enum TrainingIssue {
    /// The port's loss does not get below the bound (its losses and PyTorch's, as printed).
    DoesNotOverfit(String),
    /// The likely cause of the findings (printed after `likely cause: `).
    LikelyCause(String),
    /// A gradient-health flag (printed after `gradient health: `): no gradient, a vanishing or
    /// exploding one, dead units, rounding noise.
    Health(String),
    /// Any other finding (a parameter never updated, a step where the training parts from
    /// PyTorch's, weights that moved differently), as printed.
    Other(String),
}

impl TrainingIssue {
    /// Whether this says that the port does not overfit one batch.
    pub fn is_does_not_overfit(&self) -> bool {
        matches!(self, TrainingIssue::DoesNotOverfit(_))
    }

    /// The likely cause this names, without its `likely cause: `.
    pub fn likely_cause(&self) -> Option<&str> {
        match self {
            TrainingIssue::LikelyCause(cause) => Some(cause),
            _ => None,
        }
    }
}

impl fmt::Display for TrainingIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainingIssue::DoesNotOverfit(text) | TrainingIssue::Other(text) => f.write_str(text),
            TrainingIssue::LikelyCause(cause) => write!(f, "likely cause: {cause}"),
            TrainingIssue::Health(flag) => write!(f, "gradient health: {flag}"),
        }
    }
}

/// A finding of a check with a schedule beyond its steps' values (`run/forward.rs`,
/// `run/schedule.rs`): a line under "through the schedule:".
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleIssue {
    /// Padding leaks into valid outputs: with other tokens at the padded positions, a step's
    /// output moves (which, where, from what to what, as printed).
    PaddingLeaks(String),
    /// Generating on its own, the port picks other tokens than the reference beyond a tie within
    /// rounding, or produces none (as printed).
    FreeRunning(String),
    /// One of these passes could not run: the port failed in it, or golden could not build its
    /// input (as printed).
    CouldNotRun(String),
    /// The port's sampler does not draw as transformers' does (`decode(generate = N,
    /// sample(...))`): the vector, the draws or counts, and its diagnosis.
    Sampler(Box<crate::judge::sampler::SamplerFinding>),
}

impl fmt::Display for ScheduleIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleIssue::PaddingLeaks(text)
            | ScheduleIssue::FreeRunning(text)
            | ScheduleIssue::CouldNotRun(text) => f.write_str(text),
            ScheduleIssue::Sampler(finding) => write!(f, "{finding}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::inputs::Style;

    fn disagreement() -> GradientIssue {
        GradientIssue::FiniteDifferences(FdDisagreement {
            target: "x".into(),
            finding: "∂out[0]/∂x[1] is 2 in the port's backward, 1 by finite differences".into(),
        })
    }

    #[test]
    fn a_finite_difference_finding_prints_its_target_and_reports_it_wrapped_or_not() {
        let own = disagreement();
        assert_eq!(
            own.to_string(),
            "`x`: ∂out[0]/∂x[1] is 2 in the port's backward, 1 by finite differences"
        );
        assert_eq!(own.target(), Some("x"));
        assert!(own.is_finite_differences());
        let case = CaseParams {
            dims: vec![("n".into(), 3)],
            seed: 7,
            style: Style::Declared,
            steps: None,
            config: Vec::new(),
        };
        let wrapped = GradientIssue::OnAnotherCase {
            case: case.clone(),
            issue: Box::new(own.clone()),
        };
        assert_eq!(
            wrapped.to_string(),
            format!("on another failing case ({case}): {own}")
        );
        assert!(wrapped
            .to_string()
            .starts_with("on another failing case (dims n=3, values declared, seed "));
        // Still about `x`, but not this case's own finding (nor a cause, nor the forward).
        assert_eq!(wrapped.target(), Some("x"));
        assert!(!wrapped.is_finite_differences());
        assert_eq!(wrapped.likely_cause(), None);
        assert!(!wrapped.is_forward_differs());
    }

    #[test]
    fn the_forward_and_the_likely_cause_say_what_their_methods_say() {
        let forward = GradientIssue::ForwardDiffers(vec!["`out`".into(), "`h`".into()]);
        assert!(forward.is_forward_differs());
        assert_eq!(forward.target(), None);
        assert!(forward
            .to_string()
            .starts_with("the forward differs too: the port's outputs `out`, `h` differ"));
        let cause = GradientIssue::LikelyCause("a wrong backward".into());
        assert_eq!(cause.to_string(), "likely cause: a wrong backward");
        assert_eq!(cause.likely_cause(), Some("a wrong backward"));
        let other = GradientIssue::Other("`x`: looks like a target, is not one".into());
        assert_eq!(other.target(), None);
        assert_eq!(other.likely_cause(), None);

        let training = TrainingIssue::LikelyCause("the update has the wrong sign".into());
        assert_eq!(
            training.to_string(),
            "likely cause: the update has the wrong sign"
        );
        assert_eq!(
            training.likely_cause(),
            Some("the update has the wrong sign")
        );
        let health = TrainingIssue::Health("`w`: no gradient at any step".into());
        assert_eq!(
            health.to_string(),
            "gradient health: `w`: no gradient at any step"
        );
        assert_eq!(health.likely_cause(), None);
        assert!(
            TrainingIssue::DoesNotOverfit("the port does not overfit one batch".into())
                .is_does_not_overfit()
        );
    }
}
