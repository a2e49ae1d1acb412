//! `cargo xtask workflow <file.yml> <job> [--in DIR]`: run a GitHub Actions job's steps here, as the
//! runner would, so that golden's CI recipe (`examples/port-llama/.github/workflows/golden.yml`)
//! is exercised as written and cannot rot.
//!
//! * each `run:` step runs with `bash -e` (GitHub's default shell), in `DIR` (or its
//!   `working-directory`), with the workflow's, the job's and the step's `env:` over this
//!   process's environment, and `GITHUB_STEP_SUMMARY`, `GITHUB_PATH`, `GITHUB_ENV`,
//!   `GITHUB_WORKSPACE` and `RUNNER_TEMP` as the runner sets them (a line a step appends to
//!   `GITHUB_PATH` or `GITHUB_ENV` applies to the steps after it);
//! * a step runs when no step before it failed, or when its `if:` is `always()`; a job-level `if:`
//!   is the caller's choice (it names the job);
//! * `uses:` steps are actions of GitHub's: checkout, the toolchain, caches and Python are what
//!   this machine already has, and are skipped, named; `actions/upload-artifact` is checked: the
//!   paths it would upload are listed, and at least one must exist;
//! * a job with a `strategy: matrix:` (each key a list of values) runs once per combination, as
//!   GitHub's runner starts one job per combination (the recipe splits its checks across runners
//!   with nextest's `--partition`), each with `${{ matrix.<key> }}` replaced by its value; one
//!   combination failing fails the job, after the others ran (`fail-fast: false`);
//! * any other expression (`${{ … }}`) in a `run:` or an `env:` value is refused: the recipe must
//!   run the same anywhere.
//!
//! * the job runs the pull request's code, so it must hold nothing to misuse: its token is
//!   read-only (`permissions:` of the job or the workflow, each `read` or `none`) and every
//!   `actions/checkout` step keeps no credential (`persist-credentials: false`); a recipe that
//!   drops either is refused before any step runs.
//!
//! At the end the job's step summary is printed, and must not be empty when a step writes one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

fn string_map(v: &Yaml, what: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let Some(hash) = v.as_hash() else {
        return Ok(out);
    };
    for (k, v) in hash {
        let key = k
            .as_str()
            .ok_or(format!("{what}: a key that is not a string"))?;
        let value = match v {
            Yaml::String(s) => s.clone(),
            Yaml::Integer(i) => i.to_string(),
            Yaml::Boolean(b) => b.to_string(),
            Yaml::Real(r) => r.clone(),
            other => return Err(format!("{what}.{key}: not a plain value: {other:?}")),
        };
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

/// Why the job `spec` of the workflow `doc` could misuse what GitHub hands it, if it could: a token
/// that may write, or a checkout that keeps its credential for the steps after it.
fn unsafe_settings(doc: &Yaml, spec: &Yaml, job: &str) -> Option<String> {
    let permissions = if spec["permissions"].is_badvalue() {
        &doc["permissions"]
    } else {
        &spec["permissions"]
    };
    let read_only = match permissions {
        Yaml::String(s) => s == "read-all" || s == "{}",
        Yaml::Hash(h) => h
            .values()
            .all(|v| matches!(v.as_str(), Some("read" | "none"))),
        _ => false,
    };
    if !read_only {
        return Some(format!(
            "jobs.{job}: its token may write (no `permissions:` of the job or the workflow, or one \
             that is not `read` or `none`): give the workflow `permissions: contents: read`"
        ));
    }
    let steps = spec["steps"]
        .as_vec()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for step in steps {
        let checkout = step["uses"]
            .as_str()
            .is_some_and(|u| u.starts_with("actions/checkout"));
        let kept = match &step["with"]["persist-credentials"] {
            Yaml::Boolean(b) => *b,
            Yaml::String(s) => s != "false",
            _ => true,
        };
        if checkout && kept {
            return Some(format!(
                "jobs.{job}: `{}` keeps its credential in .git for the pull request's code: give \
                 it `with: persist-credentials: false`",
                step["uses"].as_str().unwrap_or_default()
            ));
        }
    }
    None
}

/// One combination of a job's matrix: each key's value.
type Combination = BTreeMap<String, String>;

/// The combinations of a job's `strategy.matrix`, in the order GitHub lists them (the first key
/// varying slowest); one empty combination for a job without a matrix.
fn combinations(spec: &Yaml, job: &str) -> Result<Vec<Combination>, String> {
    let matrix = &spec["strategy"]["matrix"];
    let Some(keys) = matrix.as_hash() else {
        if matrix.is_badvalue() || matrix.is_null() {
            return Ok(vec![Combination::new()]);
        }
        return Err(format!("jobs.{job}.strategy.matrix: not a map of lists"));
    };
    let mut all = vec![Combination::new()];
    for (key, values) in keys {
        let key = key.as_str().ok_or(format!(
            "jobs.{job}.strategy.matrix: a key that is not a string"
        ))?;
        if key == "include" || key == "exclude" {
            return Err(format!(
                "jobs.{job}.strategy.matrix.{key}: this runner expands plain lists only"
            ));
        }
        let values = values
            .as_vec()
            .ok_or(format!("jobs.{job}.strategy.matrix.{key}: not a list"))?;
        let values: Vec<String> = values
            .iter()
            .map(|v| match v {
                Yaml::String(s) => Ok(s.clone()),
                Yaml::Integer(i) => Ok(i.to_string()),
                Yaml::Boolean(b) => Ok(b.to_string()),
                Yaml::Real(r) => Ok(r.clone()),
                other => Err(format!(
                    "jobs.{job}.strategy.matrix.{key}: not a plain value: {other:?}"
                )),
            })
            .collect::<Result<_, _>>()?;
        all = all
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.insert(key.to_string(), v.clone());
                    c
                })
            })
            .collect();
    }
    Ok(all)
}

/// `text` with each `${{ matrix.<key> }}` replaced by the combination's value; any other
/// expression, or a key the matrix does not have, is refused.
fn substitute(text: &str, combination: &Combination, what: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 3..];
        let end = after
            .find("}}")
            .ok_or(format!("{what}: an expression without its closing `}}}}`"))?;
        let expression = after[..end].trim();
        let value = expression
            .strip_prefix("matrix.")
            .and_then(|key| combination.get(key))
            .ok_or(format!(
                "{what}: the expression `${{{{ {expression} }}}}` is not one this runner \
                 evaluates (only `matrix.<key>` of the job's matrix)"
            ))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Run `job` of the workflow `file` in `dir`: once per combination of its matrix.
pub fn run(file: &Path, job: &str, dir: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let docs = YamlLoader::load_from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let doc = docs.first().ok_or(format!("{}: empty", file.display()))?;
    let spec = &doc["jobs"][job];
    if spec.is_badvalue() {
        return Err(format!("{}: no job `{job}`", file.display()));
    }
    if let Some(why) = unsafe_settings(doc, spec, job) {
        return Err(format!("{}: {why}", file.display()));
    }
    let mut failed = Vec::new();
    for combination in combinations(spec, job)? {
        let shown = if combination.is_empty() {
            job.to_string()
        } else {
            let values: Vec<String> = combination
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            format!("{job} ({})", values.join(", "))
        };
        if let Err(e) = run_combination(file, doc, spec, job, &shown, &combination, dir) {
            eprintln!("workflow: {e}");
            failed.push(e);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// Run one combination of a job's matrix (the job itself, without one).
fn run_combination(
    file: &Path,
    doc: &Yaml,
    spec: &Yaml,
    job: &str,
    shown: &str,
    combination: &Combination,
    dir: &Path,
) -> Result<(), String> {
    let expand = |map: BTreeMap<String, String>, what: &str| -> Result<_, String> {
        map.into_iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    substitute(&v, combination, &format!("{what}.{k}"))?,
                ))
            })
            .collect::<Result<BTreeMap<_, _>, String>>()
    };
    let mut env = expand(string_map(&doc["env"], "env")?, "env")?;
    env.extend(expand(
        string_map(&spec["env"], &format!("jobs.{job}.env"))?,
        &format!("jobs.{job}.env"),
    )?);
    let steps = spec["steps"]
        .as_vec()
        .ok_or(format!("jobs.{job}.steps: not a list"))?;

    let temp = std::env::temp_dir().join(format!(
        "golden-workflow-{}-{job}-{}",
        std::process::id(),
        combination.values().cloned().collect::<Vec<_>>().join("-")
    ));
    let _ = std::fs::remove_dir_all(&temp);
    let runner_temp = temp.join("runner-temp");
    std::fs::create_dir_all(&runner_temp).map_err(|e| format!("{}: {e}", temp.display()))?;
    let summary = temp.join("step-summary.md");
    let github_path = temp.join("github-path");
    let github_env = temp.join("github-env");
    for f in [&summary, &github_path, &github_env] {
        std::fs::write(f, "").map_err(|e| format!("{}: {e}", f.display()))?;
    }
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut path_prefix: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut summary_written = false;

    for (i, step) in steps.iter().enumerate() {
        let name = step["name"]
            .as_str()
            .or(step["uses"].as_str())
            .map(str::to_string)
            .unwrap_or_else(|| format!("step {}", i + 1));
        let condition = step["if"].as_str().map(str::trim);
        match condition {
            None if !failed.is_empty() => {
                eprintln!("workflow: `{name}`: skipped (a step before it failed)");
                continue;
            }
            None | Some("always()") => {}
            Some(other) => {
                return Err(format!(
                    "`{name}`: `if: {other}` is not something this runner decides (only always())"
                ))
            }
        }
        if let Some(action) = step["uses"].as_str() {
            if action.starts_with("actions/upload-artifact") {
                let paths = substitute(
                    step["with"]["path"].as_str().unwrap_or_default(),
                    combination,
                    &format!("`{name}`.with.path"),
                )?;
                let found: Vec<&str> = paths
                    .lines()
                    .map(str::trim)
                    .filter(|p| !p.is_empty() && dir.join(p).exists())
                    .collect();
                eprintln!("workflow: `{name}`: would upload {found:?} (of {paths:?})");
                if found.is_empty() {
                    failed.push(format!("`{name}`: none of its paths exists: {paths:?}"));
                }
            } else {
                eprintln!("workflow: `{name}`: a GitHub action; this machine has what it sets up");
            }
            continue;
        }
        let Some(script) = step["run"].as_str() else {
            return Err(format!("`{name}`: neither `run` nor `uses`"));
        };
        let script = substitute(script, combination, &format!("`{name}`"))?;
        let script = script.as_str();
        let mut step_env = env.clone();
        step_env.extend(expand(
            string_map(&step["env"], &format!("`{name}`.env"))?,
            &format!("`{name}`.env"),
        )?);
        for line in std::fs::read_to_string(&github_env)
            .unwrap_or_default()
            .lines()
        {
            if let Some((k, v)) = line.split_once('=') {
                step_env.insert(k.to_string(), v.to_string());
            }
        }
        let cwd = match step["working-directory"].as_str() {
            Some(w) => dir.join(w),
            None => dir.clone(),
        };
        let path = path_prefix
            .iter()
            .rev()
            .cloned()
            .chain(std::env::var("PATH").ok())
            .collect::<Vec<_>>()
            .join(":");
        eprintln!("workflow: `{name}`:\n{}", script.trim_end());
        let before = std::fs::metadata(&summary).map(|m| m.len()).unwrap_or(0);
        let status = Command::new("bash")
            .args(["--noprofile", "--norc", "-e", "-c", script])
            .current_dir(&cwd)
            .envs(&step_env)
            .env("PATH", path)
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env("GITHUB_PATH", &github_path)
            .env("GITHUB_ENV", &github_env)
            .env("GITHUB_WORKSPACE", &dir)
            .env("RUNNER_TEMP", &runner_temp)
            .status()
            .map_err(|e| format!("`{name}`: could not run bash: {e}"))?;
        if std::fs::metadata(&summary).map(|m| m.len()).unwrap_or(0) > before {
            summary_written = true;
        }
        path_prefix = std::fs::read_to_string(&github_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect();
        if !status.success() {
            eprintln!("workflow: `{name}` failed ({status})");
            failed.push(format!("`{name}` ({status})"));
        }
    }
    let text = std::fs::read_to_string(&summary).unwrap_or_default();
    eprintln!("workflow: {shown}: the job's summary ($GITHUB_STEP_SUMMARY):\n{text}");
    let writes_summary = steps.iter().any(|s| {
        s["run"]
            .as_str()
            .is_some_and(|r| r.contains("GITHUB_STEP_SUMMARY"))
    });
    if writes_summary && !summary_written {
        failed.push("the job's summary is empty".into());
    }
    let _ = std::fs::remove_dir_all(&temp);
    if failed.is_empty() {
        eprintln!("workflow: job `{shown}` of {} passed", file.display());
        Ok(())
    } else {
        Err(format!(
            "job `{shown}` of {} failed: {}",
            file.display(),
            failed.join("; ")
        ))
    }
}

/// `cargo xtask workflow FILE JOB [--in DIR]`.
pub fn main(args: &[String]) -> Result<(), String> {
    let usage = "usage: cargo xtask workflow <workflow.yml> <job> [--in <dir>]";
    let (file, job) = match args {
        [file, job, ..] => (PathBuf::from(file), job.as_str()),
        _ => return Err(usage.into()),
    };
    let dir = match &args[2..] {
        [] => std::env::current_dir().map_err(|e| e.to_string())?,
        [flag, dir] if flag == "--in" => PathBuf::from(dir),
        _ => return Err(usage.into()),
    };
    run(&file, job, &dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Option<String> {
        let doc = &YamlLoader::load_from_str(text).unwrap()[0];
        unsafe_settings(doc, &doc["jobs"]["j"], "j")
    }

    #[test]
    fn a_matrix_runs_each_combination_with_its_values() {
        let recipe = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/port-llama/.github/workflows/golden.yml"
        ))
        .unwrap();
        let doc = &YamlLoader::load_from_str(&recipe).unwrap()[0];
        // The recipe splits its checks across runners: both jobs, each partition once.
        for job in ["replay", "verify"] {
            let all = combinations(&doc["jobs"][job], job).unwrap();
            let partitions: Vec<&str> = all.iter().map(|c| c["partition"].as_str()).collect();
            assert_eq!(partitions, ["1", "2"], "{job}");
            let runs: Vec<&str> = doc["jobs"][job]["steps"]
                .as_vec()
                .unwrap()
                .iter()
                .filter_map(|s| s["run"].as_str())
                .collect();
            let split = runs
                .iter()
                .find(|r| r.contains("--partition"))
                .expect("a step runs its share of the checks");
            assert!(
                substitute(split, &all[1], "step")
                    .unwrap()
                    .contains("cargo nextest run --partition count:2/2"),
                "{split}"
            );
        }
        let two = |text: &str| YamlLoader::load_from_str(text).unwrap()[0].clone();
        let job = two("strategy:\n  matrix:\n    a: [1, 2]\n    b: [x, y, z]\n");
        let all = combinations(&job, "j").unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!((all[1]["a"].as_str(), all[1]["b"].as_str()), ("1", "y"));
        assert_eq!(combinations(&two("steps: []\n"), "j").unwrap().len(), 1);
        assert!(
            combinations(&two("strategy:\n  matrix:\n    include: [{a: 1}]\n"), "j")
                .unwrap_err()
                .contains("plain lists only")
        );
        let e = substitute("echo ${{ github.token }}", &all[0], "`s`").unwrap_err();
        assert!(e.contains("not one this runner evaluates"), "{e}");
        let e = substitute("echo ${{ matrix.c }}", &all[0], "`s`").unwrap_err();
        assert!(e.contains("`${{ matrix.c }}`"), "{e}");
    }

    #[test]
    fn a_job_with_a_token_that_may_write_or_a_kept_credential_is_refused() {
        let recipe = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/port-llama/.github/workflows/golden.yml"
        ))
        .unwrap();
        let doc = &YamlLoader::load_from_str(&recipe).unwrap()[0];
        for name in ["replay", "verify"] {
            assert_eq!(unsafe_settings(doc, &doc["jobs"][name], name), None);
        }
        let steps = "  j:\n    steps:\n      - uses: actions/checkout@v4\n        with:\n          persist-credentials: false\n";
        assert_eq!(
            job(&format!("permissions:\n  contents: read\njobs:\n{steps}")),
            None
        );
        assert!(job(&format!("jobs:\n{steps}"))
            .unwrap()
            .contains("may write"));
        assert!(
            job(&format!("permissions:\n  contents: write\njobs:\n{steps}"))
                .unwrap()
                .contains("may write")
        );
        assert!(job(&format!("permissions: write-all\njobs:\n{steps}")).is_some());
        let kept = "permissions:\n  contents: read\njobs:\n  j:\n    steps:\n      - uses: actions/checkout@v4\n";
        assert!(job(kept).unwrap().contains("persist-credentials: false"));
    }
}
