//! The runners: generating cases and shrinking failures (`check`), and the kinds of check that use
//! it: the forward comparison, the gradient check and the overfit check; how they call the port
//! (`port`: on a thread of its own, bounded by the timeout, panics caught); the saved failing
//! cases each check replays first (`regressions`).

pub mod check;
pub mod forward;
pub mod gradients;
pub mod mutations;
pub mod overfit;
pub mod port;
pub(crate) mod regressions;
pub(crate) mod sampling;
pub mod schedule;
pub mod steps;
