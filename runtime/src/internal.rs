//! golden's layers along the data's path, for golden's own command line, benchmarks and tests.
//!
//! **Not a stable API**: anything in here may change or go away in any release, minor or patch. A
//! user's crate needs only the items at the crate's root. The layers' files stay where
//! `ARCHITECTURE.md` shows them (`src/describe/`, `src/python/`, …); this module only gathers them
//! behind one name.

#[path = "answers/mod.rs"]
pub mod answers;
#[path = "describe/mod.rs"]
pub mod describe;
#[path = "judge/mod.rs"]
pub mod judge;
#[path = "python/mod.rs"]
pub mod python;
#[path = "report/mod.rs"]
pub mod report;
#[path = "run/mod.rs"]
pub mod run;
