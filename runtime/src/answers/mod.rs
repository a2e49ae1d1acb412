//! The reference's answers for a case: live from a Python worker, replayed from the golden store,
//! or both while recording; and, in module form, the parameters the port is served.

pub mod checkpoint;
pub mod live;
pub mod mutations;
pub mod params;
pub mod provenance;
pub mod source;
pub mod store;
pub mod timing;
