//! `golden report`: the HTML report (to be written).

use std::path::PathBuf;

pub fn run(_results: Option<PathBuf>, _out: Option<PathBuf>) -> Result<PathBuf, String> {
    Err("not yet".into())
}
