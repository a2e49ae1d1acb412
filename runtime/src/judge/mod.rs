//! Judging the port: comparison with sound tolerances, the likely causes of a mismatch, and how a
//! trace of tapped points is compared.

pub mod compare;
pub mod diagnose;
pub mod trace;
