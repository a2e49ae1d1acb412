//! The `golden` command-line tool's commands, as a library (the framework's own tests call them):
//! `diff` (two tensor files or folders), `show` (one tensor), `report` (the HTML report), and the
//! natural order of tensor names they share.

pub mod diff;
pub mod natural;
pub mod report;
pub mod show;
