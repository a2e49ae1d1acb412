//! The book (`docs/`, mdBook) and the links of the repository's Markdown.
//!
//! * `cargo xtask links` checks every relative link of README.md, ARCHITECTURE.md,
//!   benches/README.md and the book's chapters: the file it names exists, the anchor after `#` is a
//!   heading of that file, a chapter's link stays inside the book (a link out of `docs/src` is
//!   broken in the built book), and SUMMARY.md lists every chapter and only chapters that exist.
//!   It needs nothing but this crate.
//! * `cargo xtask book` installs mdBook (a pinned version, once, into a folder outside the
//!   checkout, beside golden's venv: `$XDG_CACHE_HOME/golden/tools`, else `~/.cache/golden/tools`),
//!   builds the book into `target/book`, then checks the links as above.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The mdBook the book is built with; `cargo install` builds it without its server, watcher and
/// search (none of which a build needs).
const MDBOOK_VERSION: &str = "0.5.4";

/// The Markdown files whose links are checked, relative to the root; every `.md` under `docs/src`
/// is added to these.
const FILES: &[&str] = &["README.md", "ARCHITECTURE.md", "benches/README.md"];

/// `cargo xtask book`.
pub fn book(root: &Path) -> Result<(), String> {
    let mdbook = mdbook()?;
    crate::run(Command::new(&mdbook).arg("build").arg(root.join("docs")))?;
    links(root)?;
    eprintln!(
        "xtask: the book is in {}",
        root.join("target/book/index.html").display()
    );
    Ok(())
}

/// The pinned mdBook, installed into `$XDG_CACHE_HOME/golden/tools` (else
/// `~/.cache/golden/tools`) when it is not there yet: outside the checkout, so that every clone
/// reuses it.
fn mdbook() -> Result<PathBuf, String> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .ok_or("neither XDG_CACHE_HOME nor HOME is set: no folder to install mdBook into")?;
    let tools = cache.join("golden/tools");
    let bin = tools.join("bin/mdbook");
    let installed = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let wanted = format!("mdbook v{MDBOOK_VERSION}");
    if installed.as_deref() == Some(wanted.as_str()) {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing mdBook {MDBOOK_VERSION} into {} (once; several minutes on two cores){}",
        tools.display(),
        installed.map_or(String::new(), |v| format!(": found {v}"))
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::run(
        Command::new(cargo)
            .args([
                "install",
                "mdbook",
                "--version",
                MDBOOK_VERSION,
                "--locked",
                "--no-default-features",
                "--force",
                "--root",
            ])
            .arg(&tools),
    )?;
    Ok(bin)
}

/// `cargo xtask links`: every broken link, each with its file and line, or Ok.
pub fn links(root: &Path) -> Result<(), String> {
    let mut files: Vec<PathBuf> = FILES.iter().map(|f| root.join(f)).collect();
    let chapters = chapters(&root.join("docs/src"))?;
    files.extend(chapters.iter().cloned());
    let mut docs = Docs::default();
    let mut problems = Vec::new();
    for file in &files {
        let text = docs
            .text(file)
            .map_err(|e| format!("{}: {e}", shown(root, file)))?;
        for link in links_of(&text) {
            if let Some(problem) = check(root, file, &link.dest, &mut docs) {
                problems.push(format!(
                    "{}:{}: `{}`: {problem}",
                    shown(root, file),
                    link.line,
                    link.dest
                ));
            }
        }
    }
    problems.extend(summary_problems(root, &chapters, &mut docs));
    if problems.is_empty() {
        eprintln!(
            "xtask: links: {} Markdown files, every relative link and anchor resolves",
            files.len()
        );
        Ok(())
    } else {
        Err(format!(
            "{} broken links in the docs:\n  {}",
            problems.len(),
            problems.join("\n  ")
        ))
    }
}

fn shown(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

/// Every `.md` file under `dir`, sorted.
fn chapters(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The Markdown read so far, and the anchors of its headings.
#[derive(Default)]
struct Docs {
    texts: BTreeMap<PathBuf, String>,
}

impl Docs {
    fn text(&mut self, file: &Path) -> std::io::Result<String> {
        if let Some(text) = self.texts.get(file) {
            return Ok(text.clone());
        }
        let text = std::fs::read_to_string(file)?;
        self.texts.insert(file.to_path_buf(), text.clone());
        Ok(text)
    }
}

/// A link's destination and the line it is on (1-based).
#[derive(Debug, PartialEq)]
struct Link {
    dest: String,
    line: usize,
}

fn parser(text: &str) -> Parser<'_> {
    // What mdBook enables, so that both see the same links and headings.
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES;
    Parser::new_ext(text, options)
}

/// The links and images of a Markdown text.
fn links_of(text: &str) -> Vec<Link> {
    parser(text)
        .into_offset_iter()
        .filter_map(|(event, range)| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => Some(Link {
                dest: dest_url.to_string(),
                line: text[..range.start].matches('\n').count() + 1,
            }),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings, as GitHub and mdBook make them: the heading's text
/// lowercased, spaces as `-`, only letters, digits, `-` and `_` kept; a repeated one gets `-1`,
/// `-2`, ... An explicit `{#id}` wins.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<(String, Option<String>)> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                heading = Some((String::new(), id.map(|id| id.to_string())));
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((words, _)) = heading.as_mut() {
                    words.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let Some((words, id)) = heading.take() else {
                    continue;
                };
                let anchor = id.unwrap_or_else(|| {
                    let base = slug(&words);
                    let n = seen.entry(base.clone()).or_insert(0);
                    let anchor = if *n == 0 {
                        base.clone()
                    } else {
                        format!("{base}-{n}")
                    };
                    *n += 1;
                    anchor
                });
                out.insert(anchor);
            }
            _ => {}
        }
    }
    out
}

fn slug(words: &str) -> String {
    words
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".into())
            } else {
                None
            }
        })
        .collect()
}

/// What is wrong with a link of `file` to `dest`, if anything. Links with a scheme (https:,
/// mailto:) are not followed.
fn check(root: &Path, file: &Path, dest: &str, docs: &mut Docs) -> Option<String> {
    if dest.contains("://") || dest.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match dest.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (dest, None),
    };
    let target = if path.is_empty() {
        file.to_path_buf()
    } else if path.starts_with('/') {
        return Some("an absolute path: write it relative to this file".into());
    } else {
        normal(&file.parent().unwrap_or(root).join(path))
    };
    if !target.exists() {
        return Some(format!("{} does not exist", shown(root, &target)));
    }
    let book = root.join("docs/src");
    if file.starts_with(&book) && !target.starts_with(&book) {
        return Some(format!(
            "leads out of the book to {}: the built book has no such page; name the file in \
             `code` instead",
            shown(root, &target)
        ));
    }
    let anchor = anchor?;
    if target.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = match docs.text(&target) {
        Ok(text) => text,
        Err(e) => return Some(format!("{}: {e}", shown(root, &target))),
    };
    let have = anchors(&text);
    if have.contains(anchor) {
        return None;
    }
    // The anchors it may have meant: a few edits away, or one containing the other.
    let mut near: Vec<(usize, &String)> = have
        .iter()
        .map(|a| (strsim::levenshtein(a, anchor), a))
        .filter(|(d, a)| {
            *d <= 2.max(anchor.len() / 5) || a.contains(anchor) || anchor.contains(a.as_str())
        })
        .collect();
    near.sort();
    let near: Vec<&String> = near.into_iter().take(3).map(|(_, a)| a).collect();
    Some(format!(
        "{} has no heading with the anchor `#{anchor}`{}",
        shown(root, &target),
        if near.is_empty() {
            String::new()
        } else {
            format!(" (it has {near:?})")
        }
    ))
}

/// `a/b/../c` -> `a/c`, without touching the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// SUMMARY.md must list every chapter of `docs/src` (mdBook leaves an unlisted one out of the book
/// silently); the chapters it lists that do not exist are found by the link check.
fn summary_problems(root: &Path, chapters: &[PathBuf], docs: &mut Docs) -> Vec<String> {
    let src = root.join("docs/src");
    let summary = src.join("SUMMARY.md");
    let Ok(text) = docs.text(&summary) else {
        return vec!["docs/src/SUMMARY.md is missing".into()];
    };
    let listed: BTreeSet<PathBuf> = links_of(&text)
        .iter()
        .map(|l| normal(&src.join(l.dest.split('#').next().unwrap_or_default())))
        .collect();
    chapters
        .iter()
        .filter(|c| **c != summary && !listed.contains(*c))
        .map(|c| {
            format!(
                "{} is not in docs/src/SUMMARY.md: the book leaves it out",
                shown(root, c)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_made_as_github_and_mdbook_make_them() {
        let text = "# golden\n## Configuration sweeps: `one_of`\n## The `golden` command line\n\
                    ### The shared worker (nextest)\n## Faults\n## Faults\n\
                    ```text\n## not a heading\n```\n## Named {#here}\n";
        let have: Vec<String> = anchors(text).into_iter().collect();
        assert_eq!(
            have,
            [
                "configuration-sweeps-one_of",
                "faults",
                "faults-1",
                "golden",
                "here",
                "the-golden-command-line",
                "the-shared-worker-nextest",
            ]
        );
    }

    #[test]
    fn a_broken_link_is_named_with_its_file_line_and_cause() {
        let root = std::env::temp_dir().join(format!("xtask-links-{}", std::process::id()));
        let src = root.join("docs/src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(root.join("benches")).unwrap();
        let write = |path: &str, text: &str| std::fs::write(root.join(path), text).unwrap();
        write(
            "README.md",
            "# r\n\n[ok](docs/src/a.md#first) [bad anchor](docs/src/a.md#firts)\n",
        );
        write(
            "ARCHITECTURE.md",
            "# a\n[gone](missing.md) [web](https://x.invalid/y)\n",
        );
        write("benches/README.md", "# b\n[up](../README.md#r)\n");
        write("docs/src/SUMMARY.md", "# Summary\n- [A](a.md)\n");
        write(
            "docs/src/a.md",
            "# First\n\n[self](#first) [out](../../ARCHITECTURE.md)\n",
        );
        write("docs/src/orphan.md", "# Orphan\n");
        let err = links(&root).unwrap_err();
        std::fs::remove_dir_all(&root).unwrap();
        let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "README.md:3: `docs/src/a.md#firts`: docs/src/a.md has no heading with the anchor \
                 `#firts` (it has [\"first\"])",
                "ARCHITECTURE.md:2: `missing.md`: missing.md does not exist",
                "docs/src/a.md:3: `../../ARCHITECTURE.md`: leads out of the book to \
                 ARCHITECTURE.md: the built book has no such page; name the file in `code` instead",
                "docs/src/orphan.md is not in docs/src/SUMMARY.md: the book leaves it out",
            ],
            "{err}"
        );
        assert!(err.starts_with("4 broken links"), "{err}");
    }

    #[test]
    fn the_repository_s_docs_have_no_broken_links() {
        links(&crate::root()).unwrap();
    }
}
