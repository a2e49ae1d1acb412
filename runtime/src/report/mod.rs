//! What a check leaves: the failure message, the artifacts of a failing case, the snapshot text and
//! the results file the HTML report reads.

pub mod artifacts;
pub mod failure;
pub mod issues;
pub mod passed;
pub mod results;
pub mod snapshot;
pub mod structure;
