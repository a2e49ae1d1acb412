//! Saved failing cases, per check: proptest's regressions file, each line tagged with the check
//! that saved it.
//!
//! proptest keeps the seeds of failing cases in one file per source file
//! (`proptest-regressions/<path>.txt` beside `src/`, else `<file>.proptest-regressions`) and
//! replays every seed in it before the generated cases of *every* test of that source file. A
//! source file holds many golden checks, each with its own case strategy: a seed saved by one
//! check draws, in another, a case that check never generates — an extra case for it, and in a
//! replay a case its golden store does not hold, so its store looks out of date. golden writes the
//! same file in the same format (`cc <hex>`, which proptest reads), with the check's name as the
//! comment — `cc <hex> # <check>: shrinks to <case>` — and a check replays the lines it saved
//! only. A line without a check's name (saved by proptest itself, or by an older golden) is
//! replayed by every check of the file, as proptest would, and the check says so.
//!
//! A saved case runs before the generated ones, and says so; `GOLDEN_SEED` set explicitly runs
//! that seed's cases alone (a porter changing the seed to look at other cases would otherwise see
//! the saved case first every time).
//!
//! **Only the port's failures are saved.** proptest hands over the seed of every failing run; golden
//! holds it ([`Regressions::keep`] writes it) until the check knows what the failure was, and keeps
//! it only for a failure of the port that its case reproduces ([`persistable`]): a timeout, a dead
//! worker, a checkpoint that changed, a reference that raised or is not deterministic, a case that
//! passed when run again say nothing about the port on that case, and a saved line asks the user to
//! commit it.

use crate::report::failure::{Failure, FailureKind, PortFault};
use proptest::test_runner::{FailurePersistence, PersistedSeed};
use std::any::Any;
use std::fmt::Debug;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};

/// The regressions file of the checks of one source file, as one check reads and writes it.
#[derive(Clone, Debug)]
pub(crate) struct Regressions {
    /// The check's name (`norm__rms_norm__gradients`): the tag of its lines.
    check: String,
    /// The file, when the source file was found.
    file: Option<PathBuf>,
    /// Whether saved cases are replayed (not with an explicit `GOLDEN_SEED`).
    replay: bool,
    /// The lines proptest asked to save, held until the check knows whether its failure is the
    /// port's ([`Regressions::keep`]); shared by the clones proptest makes.
    pending: Arc<Mutex<Vec<String>>>,
}

impl PartialEq for Regressions {
    fn eq(&self, other: &Self) -> bool {
        (&self.check, &self.file, self.replay) == (&other.check, &other.file, other.replay)
    }
}

/// Whether a check's final `failure` may be saved for the check to replay first: a failure of the
/// port, which its case `reproduced` when run again. Not a timeout (the port's or the
/// reference's), a dead worker, a changed checkpoint or store (those fail the check without a
/// case's fault: `FailureKind::Worker`, `Config`), a reference that raised or answered otherwise,
/// inputs that could not be made, nor a case that passed when run again.
pub(crate) fn persistable(failure: &Failure, reproduced: bool) -> bool {
    let FailureKind::Case(case) = &failure.kind else {
        return false;
    };
    reproduced
        && case.reference_error.is_none()
        && case.inputs_error.is_none()
        && !matches!(case.port, Some(PortFault::TimedOut(_)))
}

/// What a regressions file holds for one check.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Saved {
    /// Lines this check saved.
    pub own: Vec<PersistedSeed>,
    /// Lines no check's name tags (every check of the file replays them).
    pub untagged: Vec<PersistedSeed>,
    /// Lines other checks saved (never replayed by this one).
    pub others: usize,
}

impl Saved {
    /// How many cases this check replays first.
    pub fn replayed(&self) -> usize {
        self.own.len() + self.untagged.len()
    }
}

/// Serialises appends to regressions files within this process (checks run on parallel threads).
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Regressions {
    /// The file for `source_file` (`file!()` of the check's declaration), as proptest's
    /// `FileFailurePersistence::SourceParallel("proptest-regressions")` names it.
    pub fn new(check: String, source_file: Option<&str>, replay: bool) -> Regressions {
        Regressions {
            check,
            file: source_file.and_then(regressions_file),
            replay,
            pending: Arc::default(),
        }
    }

    /// Write the lines proptest asked to save (the check's failure is the port's: see
    /// [`persistable`]), and say so. Without this call they are dropped.
    pub fn keep(&self) {
        let lines = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(file) = &self.file else {
            return;
        };
        if lines.is_empty() {
            return;
        }
        let _guard = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = String::new();
        if !file.is_file() {
            text.push_str(HEADER);
        }
        text.extend(lines);
        let written = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| {
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(file)?
                    .write_all(text.as_bytes())
            });
        match written {
            Ok(()) => eprintln!(
                "golden: `{}`: the failing case's seed is saved in {}: this check replays it first \
                 from now on (commit the file)",
                self.check,
                file.display()
            ),
            Err(e) => eprintln!(
                "golden: `{}`: could not save the failing case's seed in {}: {e}",
                self.check,
                file.display()
            ),
        }
    }

    /// The file, when known.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// What the file holds for this check (nothing when there is no file).
    pub fn saved(&self) -> Saved {
        let Some(text) = self
            .file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
        else {
            return Saved::default();
        };
        let mut saved = Saved::default();
        for line in text.lines() {
            let (seed, comment) = match line.split_once('#') {
                Some((seed, comment)) => (seed.trim(), comment.trim()),
                None => (line.trim(), ""),
            };
            if seed.is_empty() {
                continue;
            }
            let Ok(seed) = PersistedSeed::from_str(seed) else {
                continue;
            };
            match tag(comment) {
                Some(check) if check == self.check => saved.own.push(seed),
                Some(_) => saved.others += 1,
                None => saved.untagged.push(seed),
            }
        }
        saved
    }

    /// The line a check's failure appends: `cc <hex> # <check>: shrinks to <case>`.
    fn line(&self, seed: &PersistedSeed, value: &dyn Debug) -> String {
        let case = format!("{value:?}").replace(['\n', '\r'], " ");
        format!("{seed} # {}: shrinks to {case}\n", self.check)
    }
}

/// The check a line's comment names (`norms__gelu: shrinks to ...`); `None` for proptest's own
/// comment (`shrinks to ...`).
fn tag(comment: &str) -> Option<&str> {
    if comment.starts_with("shrinks to") {
        return None;
    }
    let (check, _) = comment.split_once(": ")?;
    (!check.is_empty() && !check.contains(char::is_whitespace)).then_some(check)
}

/// proptest's header of a new regressions file.
const HEADER: &str = "\
# Seeds for failure cases proptest has generated in the past. It is
# automatically read and these particular cases re-run before any
# novel cases are generated.
#
# It is recommended to check this file in to source control so that
# everyone who runs the test benefits from these saved cases.
#
# golden: each line names the check that saved it; a check replays its own lines only.
";

impl FailurePersistence for Regressions {
    fn load_persisted_failures2(&self, _source_file: Option<&'static str>) -> Vec<PersistedSeed> {
        if !self.replay {
            return Vec::new();
        }
        let saved = self.saved();
        saved.own.into_iter().chain(saved.untagged).collect()
    }

    /// Held, not written: [`Regressions::keep`] writes it once the check knows the failure is the
    /// port's.
    fn save_persisted_failure2(
        &mut self,
        _source_file: Option<&'static str>,
        seed: PersistedSeed,
        shrunken_value: &dyn Debug,
    ) {
        let line = self.line(&seed, shrunken_value);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn box_clone(&self) -> Box<dyn FailurePersistence> {
        Box::new(self.clone())
    }

    fn eq(&self, other: &dyn FailurePersistence) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// proptest's `SourceParallel("proptest-regressions")` file for a source file: found from the
/// current folder up (`file!()` is relative to the workspace), then
/// `<dir above the folder with lib.rs or main.rs>/proptest-regressions/<rest>.txt`, else
/// `<file>.proptest-regressions` beside it (integration tests).
fn regressions_file(source_file: &str) -> Option<PathBuf> {
    let source = Path::new(source_file);
    let source = if source.is_absolute() {
        source.to_path_buf()
    } else {
        let mut dir = std::env::current_dir().ok()?;
        loop {
            let joined = dir.join(source);
            if joined.is_file() {
                break joined;
            }
            if !dir.pop() {
                return None;
            }
        }
    };
    let mut dir = source.clone();
    while dir.pop() {
        if dir.join("lib.rs").is_file() || dir.join("main.rs").is_file() {
            let suffix = source.strip_prefix(&dir).ok()?.to_path_buf();
            let mut file = dir;
            file.pop();
            file.push("proptest-regressions");
            file.push(suffix);
            file.set_extension("txt");
            return Some(file);
        }
    }
    Some(source.with_extension("proptest-regressions"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(hex: &str) -> PersistedSeed {
        PersistedSeed::from_str(&format!("cc {hex}")).unwrap()
    }

    #[test]
    fn a_check_reads_its_own_lines_and_untagged_ones_only() {
        let dir = std::env::temp_dir().join(format!("golden-regressions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = "aa".repeat(32);
        let b = "bb".repeat(32);
        let c = "cc".repeat(32);
        let file = dir.join("x.proptest-regressions");
        std::fs::write(
            &file,
            format!(
                "# header\n\ncc {a} # norms__gelu: shrinks to CaseParams {{ .. }}\n\
                 cc {b} # norms__silu: shrinks to CaseParams {{ .. }}\n\
                 cc {c} # shrinks to CaseParams {{ .. }}\n"
            ),
        )
        .unwrap();
        let regressions = Regressions {
            check: "norms__gelu".into(),
            file: Some(file.clone()),
            replay: true,
            pending: Arc::default(),
        };
        let saved = regressions.saved();
        assert_eq!(saved.own, vec![seed(&a)]);
        assert_eq!(saved.untagged, vec![seed(&c)]);
        assert_eq!(saved.others, 1);
        assert_eq!(
            regressions.load_persisted_failures2(None),
            vec![seed(&a), seed(&c)]
        );
        // An explicit seed runs its own cases.
        let explicit = Regressions {
            replay: false,
            ..regressions.clone()
        };
        assert!(explicit.load_persisted_failures2(None).is_empty());
        // A failure proptest hands over is held until the check keeps it (its port's), and
        // dropped otherwise.
        let mut silu = Regressions {
            check: "norms__silu".into(),
            pending: Arc::default(),
            ..regressions
        };
        let before = std::fs::read_to_string(&file).unwrap();
        silu.save_persisted_failure2(None, seed(&"dd".repeat(32)), &"case");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
        // proptest saves through a clone of its configuration's: the held line is shared.
        silu.box_clone()
            .as_any()
            .downcast_ref::<Regressions>()
            .unwrap()
            .keep();
        // A saved failure is tagged, and proptest's own reader still reads the line.
        let text = std::fs::read_to_string(&file).unwrap();
        let last = text.lines().last().unwrap();
        assert_eq!(
            last,
            format!("cc {} # norms__silu: shrinks to \"case\"", "dd".repeat(32))
        );
        assert_eq!(silu.saved().own.len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_file_is_where_proptest_puts_it() {
        let root = std::env::temp_dir().join(format!("golden-regfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("src/sub")).unwrap();
        std::fs::create_dir_all(root.join("tests")).unwrap();
        for f in ["src/lib.rs", "src/sub/norm.rs", "tests/t.rs"] {
            std::fs::write(root.join(f), "").unwrap();
        }
        assert_eq!(
            regressions_file(root.join("src/sub/norm.rs").to_str().unwrap()),
            Some(root.join("proptest-regressions/sub/norm.txt"))
        );
        assert_eq!(
            regressions_file(root.join("tests/t.rs").to_str().unwrap()),
            Some(root.join("tests/t.proptest-regressions"))
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
