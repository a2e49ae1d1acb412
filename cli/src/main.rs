//! `golden`: the command line beside `cargo test`.
//!
//! * `golden setup` — create or update the Python environment your crate's checks run their
//!   references in (golden's Python package, numpy, torch and `reference_py/requirements.txt`),
//!   and print its interpreter;
//! * `golden diff A B` — compare two tensor files, or folders or archives of them, in the dumps'
//!   own order (an `order.txt` beside them, numbered names) or else natural layer order, and
//!   name the first tensor that differs when that is known, the candidates when it is a guess
//!   (exit status 1 when anything differs or nothing could be compared, 2 on errors);
//! * `golden show FILE [NAME]` — statistics, a histogram and values of a tensor;
//! * `golden view [A B]` — two dumps side by side in the browser (a local web server);
//! * `golden report` — the HTML report of the last test run; `--markdown` / `--json`: a summary
//!   for reviewers of a pull request, against a base (`--base`).
//!
//! Install with `cargo install --path cli`.
//!
//! Files golden did not write may be hostile: they are read without running pickled code, each
//! within a read budget (`--read-budget`), and folders are walked without following a symlink
//! loop. Input that cannot be read is an error naming the file, with exit status 2.

use golden_cli::mapping::Mapping;
use golden_cli::read::ReadOptions;
use golden_cli::side::Side;
use golden_cli::{diff, report, setup, show, shown, summary, view};

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// What `golden --version` says: the version and the folder it was built from, so that a CI
/// recipe can tell a cached `golden` of another version or source from the one its crate depends
/// on (`examples/port-llama/.github/workflows/golden.yml`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("CARGO_MANIFEST_DIR"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "golden",
    version = VERSION,
    about = "Set up golden's Python side; compare and inspect tensors; build golden's HTML report"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How much memory reading one tensor file may take beyond the file's own size (inflated
    /// .npz entries, copied views of a .pt): 512MiB, 4GiB, ... (a bare number is MiB). Default:
    /// 64 × the file's size, at least 256 MiB and at most 16 GiB. Also GOLDEN_READ_BUDGET.
    #[arg(long, global = true, value_name = "SIZE")]
    read_budget: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Create or update the Python environment your crate's checks run their references in:
    /// golden's Python package, numpy, torch and your crate's `reference_py/requirements.txt` (or
    /// its `pyproject.toml`). Prints the interpreter on stdout. An up-to-date venv is detected from
    /// a stamp of what was installed, in a fraction of a second.
    Setup {
        /// The venv to create or update (default: GOLDEN_VENV, else ~/.cache/golden/venv, where
        /// golden's checks look for it).
        #[arg(long, value_name = "DIR")]
        venv: Option<PathBuf>,
        /// The crate (default: the nearest folder with a Cargo.toml, from the current one up).
        #[arg(long = "crate", value_name = "DIR")]
        crate_dir: Option<PathBuf>,
        /// The Python that creates a missing venv (default: GOLDEN_BOOTSTRAP_PYTHON, else python3).
        #[arg(long, value_name = "PYTHON")]
        python: Option<std::ffi::OsString>,
        /// golden's Python package, a `reference_py` folder of a golden checkout (default: that of
        /// the golden your crate depends on).
        #[arg(long, value_name = "DIR")]
        golden: Option<PathBuf>,
    },
    /// Compare two tensor files (.npy, .npz, .safetensors, .pt/.pth), or two folders or archives
    /// of them (.zip, .tar, .tar.gz/.tgz).
    Diff {
        /// The reference: a file, a folder or an archive.
        a: PathBuf,
        /// The file, folder or archive compared with it.
        b: PathBuf,
        /// Absolute tolerance (default: torch.testing.assert_close's for each dtype).
        #[arg(long)]
        atol: Option<f64>,
        /// Relative tolerance (default: torch.testing.assert_close's for each dtype).
        #[arg(long)]
        rtol: Option<f64>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Compare only tensors of equal shapes: no reshape, permutation or joining of
        /// tensor-parallel shards is tried when shapes differ.
        #[arg(long)]
        strict_shapes: bool,
        /// Rules pairing B's names with A's, one a line: `A pattern = B pattern`, with
        /// placeholders such as `{layer}` (`{layer}_post_attn = layers.{layer}.self_attn`).
        #[arg(long, value_name = "FILE")]
        map: Option<PathBuf>,
    },
    /// Show a tensor: statistics, a histogram, values.
    Show {
        /// The tensor file, or a folder or archive of them.
        file: PathBuf,
        /// Which tensor: of a file of several, its name; in a folder or archive, a file's path
        /// without the extension, then `/name` for a file of several. Without it, they are
        /// listed.
        name: Option<String>,
        /// Values to print, NumPy style: `0,:,3:7`.
        #[arg(long)]
        slice: Option<String>,
        /// Histogram bins (1 to 1000).
        #[arg(long, default_value_t = 20)]
        bins: usize,
    },
    /// Two dumps side by side in the browser: serves a page on 127.0.0.1 (a free port unless
    /// --port) and prints its address. Each side is a tensor file, a folder or an archive (.zip,
    /// .tar, .tar.gz) given here or dropped on the page; a failing check's artifacts folder
    /// (target/golden/failures/CRATE/CHECK) alone shows its reference against its port.
    /// Ctrl-C stops it and removes its temporary files.
    View {
        /// The reference (optional: or upload it from the page).
        a: Option<PathBuf>,
        /// The dumps compared with it (optional: or upload them from the page).
        b: Option<PathBuf>,
        /// The port to listen on (default: a free one).
        #[arg(long)]
        port: Option<u16>,
        /// Absolute tolerance (default: torch.testing.assert_close's for each dtype).
        #[arg(long)]
        atol: Option<f64>,
        /// Relative tolerance (default: torch.testing.assert_close's for each dtype).
        #[arg(long)]
        rtol: Option<f64>,
        /// Compare only tensors of equal shapes.
        #[arg(long)]
        strict_shapes: bool,
        /// Rules pairing B's names with A's (see `golden diff --map`).
        #[arg(long, value_name = "FILE")]
        map: Option<PathBuf>,
        /// Most bytes one upload may have: 2GiB, 512MiB, ... (default 16GiB).
        #[arg(long, value_name = "SIZE", default_value = "16GiB")]
        max_upload: String,
    },
    /// Build the HTML report of the last test run from target/golden/results; or, with
    /// --markdown or --json, a summary for reviewers of a pull request: pass and fail counts, the
    /// failures with their likely causes, and what changed against a base (--base).
    Report {
        /// The results folder (default: target/golden/results under the current workspace).
        #[arg(long)]
        results: Option<PathBuf>,
        /// Where to write the page (default: target/golden/report.html) or the summary (default:
        /// standard output).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write the summary as GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY or a pull
        /// request comment: under GitHub's 65,536 characters, rows that do not fit counted).
        #[arg(long, conflicts_with = "json")]
        markdown: bool,
        /// Write the summary as JSON (everything, untruncated).
        #[arg(long)]
        json: bool,
        /// The base to compare with: the base branch's snapshot folder (its committed .snap
        /// files, e.g. from `git archive`), or the results folder of a run of it.
        #[arg(long, value_name = "DIR")]
        base: Option<PathBuf>,
    },
}

/// `golden report --markdown` / `--json`: the summary, on stdout or in `out`. A results folder with
/// no results gives a markdown summary that says so (the step that writes it in CI runs after a
/// failed build too), and an error for JSON.
fn summary_command(
    results: Option<PathBuf>,
    out: Option<PathBuf>,
    markdown: bool,
    base: Option<PathBuf>,
) -> Result<(), String> {
    let results = results.unwrap_or_else(report::default_results);
    let text = match summary::Summary::build(&results, base.as_deref()) {
        Ok(s) if markdown => s.markdown(summary::GITHUB_LIMIT),
        Ok(s) => serde_json::to_string_pretty(&s.json()).expect("JSON") + "\n",
        Err(e) if markdown && e == report::no_results(&results) => summary::no_results(&results),
        Err(e) => return Err(e),
    };
    match out {
        Some(path) => std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// `golden diff`: open both sides (unpacking archives), read the mapping, compare.
fn diff_command(
    a: &Path,
    b: &Path,
    atol: Option<f64>,
    rtol: Option<f64>,
    strict_shapes: bool,
    map: Option<&Path>,
    read: &ReadOptions,
) -> Result<diff::Diff, String> {
    let mapping = map.map(Mapping::read).transpose()?.unwrap_or_default();
    let (a, b) = (Side::open(a, read)?, Side::open(b, read)?);
    let options = diff::Options {
        tolerance: diff::Tolerance { atol, rtol },
        strict_shapes,
    };
    diff::run_sides([&a, &b], options, &mapping, read)
}

fn main() -> ExitCode {
    // Archives are unpacked into private folders: Ctrl-C removes them too.
    golden_cli::scratch::remove_on_signal();
    let cli = Cli::parse();
    let read = match ReadOptions::new(cli.read_budget.as_deref()) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("golden: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Setup {
            venv,
            crate_dir,
            python,
            golden,
        } => {
            let args = setup::Args {
                venv,
                crate_dir,
                python,
                golden,
            };
            match setup::run(&args) {
                Ok(python) => {
                    println!("{}", python.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("golden setup: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Diff {
            a,
            b,
            atol,
            rtol,
            json,
            strict_shapes,
            map,
        } => match diff_command(&a, &b, atol, rtol, strict_shapes, map.as_deref(), &read) {
            Ok(d) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&d.json()).expect("JSON"));
                } else {
                    print!("{}", shown::lines(&d.text()));
                }
                if d.has_errors() {
                    ExitCode::from(2)
                } else if d.all_match() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("golden diff: {}", shown::shown(&e.to_string()));
                ExitCode::from(2)
            }
        },
        Command::Show {
            file,
            name,
            slice,
            bins,
        } => match show::run(&file, name.as_deref(), slice.as_deref(), bins, &read) {
            Ok(text) => {
                print!("{}", shown::lines(&text));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("golden show: {}", shown::shown(&e.to_string()));
                ExitCode::from(2)
            }
        },
        Command::View {
            a,
            b,
            port,
            atol,
            rtol,
            strict_shapes,
            map,
            max_upload,
        } => {
            let config = (|| -> Result<view::Config, String> {
                let mapping = map
                    .as_deref()
                    .map(Mapping::read)
                    .transpose()?
                    .unwrap_or_default();
                let max_upload = golden_files::budget::parse_size(&max_upload)
                    .map_err(|e| format!("--max-upload: {e}"))?;
                for (option, value) in [("--atol", atol), ("--rtol", rtol)] {
                    if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                        return Err(format!(
                            "{option} {v}: a tolerance is a finite number, 0 or more"
                        ));
                    }
                }
                Ok(view::Config {
                    port,
                    options: diff::Options {
                        tolerance: diff::Tolerance { atol, rtol },
                        strict_shapes,
                    },
                    mapping,
                    read: read.clone(),
                    max_upload,
                })
            })();
            match config.and_then(|c| view::run([a.as_deref(), b.as_deref()], c)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("golden view: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Report {
            results,
            out,
            markdown,
            json,
            base,
        } if markdown || json => match summary_command(results, out, markdown, base) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("golden report: {e}");
                ExitCode::from(2)
            }
        },
        Command::Report { base: Some(_), .. } => {
            eprintln!(
                "golden report: --base compares with a base in a summary: add --markdown or --json"
            );
            ExitCode::from(2)
        }
        Command::Report { results, out, .. } => match report::run(results, out) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("golden report: {e}");
                ExitCode::from(2)
            }
        },
    }
}
