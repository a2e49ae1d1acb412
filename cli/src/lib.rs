//! The `golden` command-line tool's commands, as a library (the framework's own tests call them):
//! `setup` (the Python environment), `diff` (two tensor files or folders), `show` (one tensor),
//! `report` (the HTML report), and what
//! they share: the natural order of tensor names, the read budget of every file (`read`) and a
//! folder walk that follows no symlink loop (`walk`).

pub mod diff;
pub mod natural;
pub mod read;
pub mod report;
pub mod setup;
pub mod show;
pub mod shown;
pub mod walk;
