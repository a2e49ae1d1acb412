//! The Python side as the runtime sees it: worker processes (private, or connections to the
//! shared daemon), the framed wire protocol they speak, and the shared memory that carries its
//! large tensors.

pub mod key;
pub mod shared;
pub mod shm;
pub mod wire;
pub mod worker;
