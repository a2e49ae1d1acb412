//! Judging the port: comparison with sound tolerances, the likely causes of a mismatch (from the
//! numbers, and from mutants of the reference), how a trace of tapped points is compared, the
//! invariants declared for the port's outputs, and where a port's gradient stops.

pub mod backward;
pub mod beams;
pub mod compare;
pub mod diagnose;
pub mod distribution;
pub mod invariants;
pub mod mutations;
pub mod sampler;
pub mod speed;
pub mod trace;
