//! golden-files: the tensors golden carries and the tensor files it reads and writes.
//!
//! [`HostTensor`] (dtype, shape, little-endian bytes) is the one tensor type of golden: it travels
//! to the Python worker, is kept in golden stores, and is what every file reader returns. The test
//! runtime writes `.npy` artifacts ([`npy`]) and may read `.safetensors` checkpoints
//! ([`safetensors`]); the `golden` command line reads every format ([`formats`]: `.npy`, `.npz`,
//! `.safetensors`, and torch.save's `.pt`/`.pth` through [`pickle`], which runs no pickled code).
//!
//! Files golden did not write may be hostile: every reader charges what a file expands to beyond
//! its own bytes (inflated entries, copied views) to the file's read [`Budget`], reads a `.pt`
//! without running pickled code, and no input makes it panic, hang or allocate beyond that budget
//! (see `fuzz/`).

#![warn(missing_docs)]

pub mod budget;
pub mod npy;
pub mod tensor;

#[cfg(feature = "formats")]
mod archive;
#[cfg(feature = "formats")]
pub mod formats;
#[cfg(feature = "formats")]
pub mod pickle;
#[cfg(feature = "safetensors")]
pub mod safetensors;

pub use budget::{Budget, OverBudget, ReadError};
pub use tensor::{Entry, HostTensor, Skipped, WireDType};
