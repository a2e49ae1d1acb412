//! golden's example zoo: candle ports of common PyTorch layers, each checked against its PyTorch
//! original (`reference_py/zoo_ref`) by `#[golden_layer]`. They are the framework's first users:
//! `cargo test -p golden-zoo --lib` runs their parity checks, and their snapshots live in this
//! crate's `snapshots/` (`zoo/snapshots/` of the repository).
//!
//! Deliberately wrong ports, whose detection the framework's own tests assert, are in
//! `tests/wrong_ports.rs`, not here.

pub mod activations;
pub mod attention;
pub mod blocks;
pub mod linear;
pub mod model;
pub mod norms;
pub mod samplers;
