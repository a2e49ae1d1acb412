//! The Python side as the runtime sees it: worker processes (private, or connections to the
//! shared daemon) and the framed wire protocol they speak.

pub mod key;
pub mod shared;
pub mod wire;
pub mod worker;
