//! `golden`: the command line beside `cargo test`.
//!
//! * `golden setup` — create or update the Python environment your crate's checks run their
//!   references in (golden's Python package, numpy, torch and `reference_py/requirements.txt`),
//!   and print its interpreter;
//! * `golden diff A B` — compare two tensor files or folders of them, in the dumps' own order (an
//!   `order.txt` beside them, numbered names) or else natural layer order, and name the first
//!   tensor that differs when that is known, the candidates when it is a guess (exit status 1
//!   when anything differs, 2 on errors);
//! * `golden show FILE [NAME]` — statistics, a histogram and values of a tensor;
//! * `golden report` — the HTML report of the last test run.
//!
//! Install with `cargo install --path cli`.
//!
//! Files golden did not write may be hostile: they are read without running pickled code, each
//! within a read budget (`--read-budget`), and folders are walked without following a symlink
//! loop. Input that cannot be read is an error naming the file, with exit status 2.

use golden_cli::read::ReadOptions;
use golden_cli::{diff, report, setup, show, shown};

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "golden",
    version,
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
    /// Compare two tensor files, or two folders of them (.npy, .npz, .safetensors, .pt/.pth).
    Diff {
        /// The reference file or folder.
        a: PathBuf,
        /// The file or folder compared with it.
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
    },
    /// Show a tensor: statistics, a histogram, values.
    Show {
        /// The tensor file.
        file: PathBuf,
        /// Which tensor of the file (a file of several lists them without it).
        name: Option<String>,
        /// Values to print, NumPy style: `0,:,3:7`.
        #[arg(long)]
        slice: Option<String>,
        /// Histogram bins (1 to 1000).
        #[arg(long, default_value_t = 20)]
        bins: usize,
    },
    /// Build the HTML report of the last test run from target/golden/results.
    Report {
        /// The results folder (default: target/golden/results under the current workspace).
        #[arg(long)]
        results: Option<PathBuf>,
        /// Where to write the page (default: target/golden/report.html).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
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
        } => match diff::run(&a, &b, diff::Tolerance { atol, rtol }, &read) {
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
        Command::Report { results, out } => match report::run(results, out) {
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
