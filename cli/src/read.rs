//! How the command line reads tensor files: each within its read budget, which `--read-budget`
//! (or `GOLDEN_READ_BUDGET`) sets for every file, and which otherwise is the file's default (64 ×
//! its size, at least 256 MiB, at most 16 GiB: see `golden_files::budget`).

use golden_files::budget::parse_size;
use golden_files::formats::TensorFile;
use golden_files::Budget;
use std::path::Path;

/// The environment variable that sets the read budget when `--read-budget` is not given.
pub const ENV: &str = "GOLDEN_READ_BUDGET";

/// How the error of a file over its budget says to raise it.
const RAISE: &str = "--read-budget SIZE (or GOLDEN_READ_BUDGET=SIZE)";

/// The read budget of every file a command reads.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// A budget in bytes and where it was set, or None for each file's default.
    limit: Option<(u64, String)>,
}

impl ReadOptions {
    /// The budget `--read-budget` gives, else `GOLDEN_READ_BUDGET`, else each file's default.
    pub fn new(option: Option<&str>) -> Result<ReadOptions, String> {
        let env = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty());
        let (text, source) = match (option, &env) {
            (Some(text), _) => (text.to_string(), format!("--read-budget {text}")),
            (None, Some(text)) => (text.clone(), format!("{ENV}={text}")),
            (None, None) => return Ok(ReadOptions::default()),
        };
        let bytes = parse_size(&text).map_err(|e| format!("{source}: {e}"))?;
        Ok(ReadOptions {
            limit: Some((bytes, format!("set by {source}"))),
        })
    }

    /// The budget of a file of `file_len` bytes.
    pub fn budget(&self, file_len: u64) -> Budget {
        match &self.limit {
            Some((bytes, origin)) => Budget::fixed(*bytes, origin.clone()),
            None => Budget::for_file(file_len),
        }
        .raise_with(RAISE)
    }

    /// Open `path` within its budget.
    pub fn open(&self, path: &Path) -> Result<TensorFile, String> {
        TensorFile::open_with(path, &|len| self.budget(len))
    }
}
