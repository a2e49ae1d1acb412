//! Judging the port: comparison with sound tolerances, the likely causes of a mismatch (from the
//! numbers, and from mutants of the reference), and how a trace of tapped points is compared.

pub mod compare;
pub mod diagnose;
pub mod mutations;
pub mod trace;
