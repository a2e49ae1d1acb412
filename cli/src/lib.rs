//! The `golden` command-line tool's commands, as a library (the framework's own tests call them):
//! `setup` (the Python environment), `diff` (two tensor files, folders or archives), `show` (one
//! tensor), `view` (two dumps side by side in the browser), `report` (the HTML report) and its
//! `summary` for pull requests (markdown, JSON, with the `speed` figures that moved against a
//! base), and what
//! they share: the sides of a comparison (`side`: a file, a folder or an archive, `unpack`ed into
//! a private `scratch` folder), how their files pair (`pairing`, with `mapping`s of names and
//! tensor-parallel shards), the comparison of a pair (`pair`, with the `layout`s that explain
//! shapes that differ), the natural order of tensor names, the read budget of every file
//! (`read`) and a folder walk that follows no symlink loop (`walk`).

pub mod diff;
pub mod layout;
pub mod mapping;
pub mod markdown;
pub mod natural;
pub mod pair;
pub mod pairing;
pub mod read;
pub mod report;
pub mod scratch;
pub mod setup;
pub mod show;
pub mod shown;
pub mod side;
pub mod speed;
pub mod summary;
pub mod unpack;
pub mod view;
pub mod walk;
