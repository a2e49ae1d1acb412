//! Every `GOLDEN_*` variable has one home: `describe/env.rs` declares it ([`VARIABLES`]), the
//! runtime reads it nowhere else, and the book's configuration table documents each one. The
//! sources of golden's crates and of its Python worker are searched for the names they mention.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use golden::internal::describe::env::{Group, VARIABLES};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn files(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ext.contains(&e))
        {
            out.push(path);
        }
    }
}

/// Every `GOLDEN_[A-Z0-9_]+` word in `text` (a trailing `_` is not part of a name: `GOLDEN_*`).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("GOLDEN_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..len].trim_end_matches('_');
        if name.len() > "GOLDEN_".len() && !before.is_some_and(|c| c.is_alphanumeric()) {
            out.insert(name.to_string());
        }
        rest = &tail[len.max(1)..];
    }
    out
}

fn declared() -> BTreeSet<&'static str> {
    VARIABLES.iter().map(|v| v.name).collect()
}

/// The sources golden ships: its crates and the worker's package (not the test fixtures).
fn sources() -> Vec<PathBuf> {
    let root = root();
    let mut out = Vec::new();
    for dir in [
        "runtime/src",
        "cli/src",
        "files/src",
        "macros/src",
        "xtask/src",
    ] {
        files(&root.join(dir), &["rs"], &mut out);
    }
    files(&root.join("reference_py/golden_ref"), &["py"], &mut out);
    out
}

/// The documentation: the README and the book.
fn docs() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md")];
    files(&root.join("docs"), &["md"], &mut out);
    out.retain(|p| p.exists());
    out
}

#[test]
fn every_variable_the_sources_name_is_declared_once() {
    let declared = declared();
    assert_eq!(
        declared.len(),
        VARIABLES.len(),
        "a variable is declared twice"
    );
    let mut missing = Vec::new();
    let sources = sources();
    assert!(
        sources.len() > 50,
        "the sources were not found: {sources:?}"
    );
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for name in names_in(&text) {
            if !declared.contains(name.as_str()) {
                missing.push(format!("{name} ({})", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "variables the sources name but describe/env.rs does not declare in VARIABLES:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_runtime_reads_golden_variables_only_in_describe_env() {
    let mut out = Vec::new();
    files(&root().join("runtime/src"), &["rs"], &mut out);
    let mut stray = Vec::new();
    for path in out {
        if path.ends_with("describe/env.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let reads = [
                "env::var(\"GOLDEN_",
                "env::var_os(\"GOLDEN_",
                "var(\"GOLDEN_",
            ];
            if reads.iter().any(|r| line.contains(r)) {
                stray.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "read a GOLDEN_* variable through describe/env.rs instead:\n  {}",
        stray.join("\n  ")
    );
}

/// The variables a table row of the docs documents (`| \`GOLDEN_X\` | ...`), each with the
/// heading it is under.
fn documented_under() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for path in docs() {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut heading = String::new();
        for line in text.lines() {
            if line.starts_with('#') {
                heading = line.trim_start_matches('#').trim().to_string();
            }
            let Some(cell) = line.strip_prefix("| `GOLDEN_") else {
                continue;
            };
            // A row whose first cell is the name alone (`| \`GOLDEN_CASES=0\` | ...` is an example).
            if let Some((name, _)) = cell.split_once("` |") {
                if !name.contains(['=', ' ', '`']) {
                    out.push((format!("GOLDEN_{name}"), heading.clone()));
                }
            }
        }
    }
    out
}

fn documented() -> BTreeSet<String> {
    documented_under().into_iter().map(|(n, _)| n).collect()
}

#[test]
fn the_table_groups_each_variable_under_its_group() {
    let mut wrong = Vec::new();
    for (name, heading) in documented_under() {
        let Some(v) = VARIABLES.iter().find(|v| v.name == name) else {
            continue;
        };
        if heading != format!("{:?}", v.group) {
            wrong.push(format!(
                "{name} is under `{heading}`, its group is {:?}",
                v.group
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_configuration_table_documents_every_declared_variable_and_no_other() {
    let documented = documented();
    let declared = declared();
    let undocumented: Vec<_> = declared
        .iter()
        .filter(|n| !documented.contains(**n))
        .collect();
    let unknown: Vec<_> = documented
        .iter()
        .filter(|n| !declared.contains(n.as_str()))
        .collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "the configuration table and describe/env.rs disagree:\n  declared, not in a table row \
         of the docs: {undocumented:?}\n  in the docs' table, not declared: {unknown:?}"
    );
}

#[test]
fn every_group_has_variables_and_each_says_what_it_does() {
    for group in [Group::Everyday, Group::Tuning, Group::Internal] {
        assert!(VARIABLES.iter().any(|v| v.group == group), "{group:?}");
    }
    for v in VARIABLES {
        assert!(v.name.starts_with("GOLDEN_") && !v.doc.is_empty(), "{v:?}");
    }
}

#[test]
fn names_are_found_as_words() {
    let text = "set GOLDEN_MODE=replay; `GOLDEN_*` and XGOLDEN_NO, GOLDEN_SEED.";
    let names: Vec<_> = names_in(text).into_iter().collect();
    assert_eq!(names, ["GOLDEN_MODE", "GOLDEN_SEED"]);
}

/// Every declared variable is read, before any case, by its own reader (`env::check_all`): a value
/// golden cannot read is an error that names the variable, wherever the variable is read later
/// (`GOLDEN_MAX_FRAME=-1` and `GOLDEN_PARENT_PID=abc` were ignored without a word, #31). Each
/// variable is here with a value its reader refuses, or among those whose every value is one golden
/// can use (a new variable must be put in one or the other).
#[test]
fn every_variable_names_a_value_it_cannot_read() {
    let unreadable: &[(&str, &str)] = &[
        ("GOLDEN_MODE", "sometimes"),
        ("GOLDEN_SEED", "0xZZ"),
        ("GOLDEN_CASES", "0"),
        ("GOLDEN_TIMEOUT", "-1"),
        ("GOLDEN_START_TIMEOUT", "soon"),
        ("GOLDEN_MEMORY_LIMIT", "-5"),
        ("GOLDEN_STORE_LIMIT", "0"),
        ("GOLDEN_WORKERS", "0"),
        ("GOLDEN_SHARED_WORKER", "maybe"),
        ("GOLDEN_SHARED_IDLE", "-1"),
        ("GOLDEN_SHM", "on"),
        ("GOLDEN_MUTATIONS", "some"),
        ("GOLDEN_VARIANTS", "yes"),
        ("GOLDEN_SPEED", "fast"),
        ("GOLDEN_PARENT_PID", "abc"),
        ("GOLDEN_MAX_FRAME", "-1"),
        ("GOLDEN_BUDGET", "soon"),
        ("GOLDEN_FAILURE_BUDGET", "0"),
    ];
    // Paths, names and commands; `GOLDEN_CASE`, read against each check's dims as it starts; the
    // command line's own, which it reads and names.
    let any_value = [
        "GOLDEN_PYTHON",
        "GOLDEN_VENV",
        "GOLDEN_CASE",
        "GOLDEN_REFERENCE_PATH",
        "GOLDEN_RUN",
        "GOLDEN_SHARED_DIR",
        "GOLDEN_BOOTSTRAP_PYTHON",
        "GOLDEN_READ_BUDGET",
    ];
    for v in VARIABLES {
        match unreadable.iter().find(|(name, _)| *name == v.name) {
            Some((name, value)) => {
                let err = (v.check)(value)
                    .expect_err(&format!("{name}={value:?} was read without an error"));
                assert!(err.starts_with(&format!("{name}={value:?} ")), "{err}");
            }
            None => {
                assert!(
                    any_value.contains(&v.name),
                    "{} is in neither list: give a value its reader refuses, or say why every value \
                     is one golden can use",
                    v.name
                );
                assert_eq!((v.check)("any text at all"), Ok(()), "{}", v.name);
            }
        }
    }
    // The readers take what the runtime's own functions take.
    for (name, value) in [
        ("GOLDEN_MAX_FRAME", "8388608"),
        ("GOLDEN_PARENT_PID", "4242"),
        ("GOLDEN_SEED", "0x2a"),
        ("GOLDEN_TIMEOUT", "inf"),
    ] {
        let v = VARIABLES.iter().find(|v| v.name == name).unwrap();
        assert_eq!((v.check)(value), Ok(()), "{name}={value}");
    }
}
