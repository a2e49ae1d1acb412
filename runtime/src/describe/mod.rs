//! What a check is about: the layer and its reference, the kinds of check and their options, the
//! generated inputs, the port's outputs, and the environment. Imports nothing else of the runtime.

pub mod checks;
pub mod env;
pub mod file_names;
pub mod hash;
pub mod inputs;
pub mod invariants;
pub mod layer;
pub mod numbers;
pub mod outputs;
pub mod rng;
pub mod sampling;
pub mod schedule;
pub mod sweep;
