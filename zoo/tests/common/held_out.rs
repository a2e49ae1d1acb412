//! The harness of the held-out measurements of issue #30 (`tests/held_out.rs`, round 1, and
//! `tests/held_out_2.rs`, round 2): a port's check run live, the causes its failure names read
//! as a user reads them, judged against the causes written down before the first run, and the
//! table `cargo xtask bench-mutations` prints. The ports are in `held_out_ports`.

use super::held_out_ports::{self, Cause, HeldOut, Round};
use golden::internal::describe::env::Mode;
use std::time::{Duration, Instant};

/// The port's check, live, variants off: its failure, if any, and how long it took.
pub fn run(p: &HeldOut) -> (Option<golden::Failure>, Duration) {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let scratch = super::Scratch::new(p.layer.name());
    let layer = super::declared_with_store(&p.layer, &scratch).mode(Mode::Live);
    let port = p.port.clone();
    let start = Instant::now();
    let failure = golden::check(&layer, &move |i: &golden::PortInputs| port(i)).err();
    (failure, start.elapsed())
}

/// The lines of a failure that name a cause, each cut to its claim (what it says the port does
/// and where; not the reference's code it quotes, nor the fix): the mutation diagnosis's
/// `likely cause:`, its `or:` alternatives found on both failing cases and `and a second
/// mistake`, and the items of the numbers' `likely causes:`. Evidence from one failing case
/// names no cause and is left out.
pub fn causes(msg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_numbers = false;
    for line in msg.lines().map(str::trim_start) {
        if in_numbers && line.starts_with("- `") {
            out.push(claim(line));
            continue;
        }
        in_numbers = line == "likely causes:";
        let cause = line.starts_with("likely cause:")
            || line.starts_with("and a second mistake")
            || (line.starts_with("or:") && !line.starts_with("or: on one failing case"));
        if cause {
            out.push(claim(line));
        }
    }
    out
}

/// A cause's line up to the reference's code it quotes or its fix.
fn claim(line: &str) -> String {
    let end = [", where the reference reads `", " — fix:"]
        .iter()
        .filter_map(|cut| line.find(cut))
        .min()
        .unwrap_or(line.len());
    line[..end].to_string()
}

/// Whether a cause names the planted mistake: it says one of `right`'s words at its site.
pub fn names(cause: &str, right: &[Cause]) -> bool {
    right
        .iter()
        .any(|c| c.names && super::says(cause, c.words, c.site))
}

/// Whether a cause only describes the port's outputs truly (one of `right`'s symptoms).
fn describes(cause: &str, right: &[Cause]) -> bool {
    right
        .iter()
        .any(|c| !c.names && super::says(cause, c.words, c.site))
}

/// What golden said about a wrong port.
pub struct Verdict {
    /// Every cause it named, in order.
    pub causes: Vec<String>,
    /// Those that name something other than the planted mistake (and are not a true
    /// description of its effect).
    pub wrong: Vec<String>,
    /// Whether the first names the planted mistake.
    first_names: bool,
}

impl Verdict {
    pub fn of(p: &HeldOut, msg: &str) -> Verdict {
        Verdict::judge(&p.causes, msg)
    }

    /// The causes of the failure message `msg`, judged against those that name the mistake.
    pub fn judge(right: &[Cause], msg: &str) -> Verdict {
        let causes = causes(msg);
        let wrong = causes
            .iter()
            .filter(|c| !names(c, right) && !describes(c, right))
            .cloned()
            .collect();
        let first_names = causes.first().is_some_and(|c| names(c, right));
        Verdict {
            causes,
            wrong,
            first_names,
        }
    }

    /// `yes`: the first cause names the mistake; `wrong`: it names another; `no`: none named
    /// (or the first only describes the outputs).
    pub fn named(&self) -> &'static str {
        match self.causes.first() {
            _ if self.first_names => "yes",
            Some(c) if self.wrong.contains(c) => "wrong",
            _ => "no",
        }
    }
}

/// Whether a failure is the port's values differing from the reference's on a case — not the
/// reference failing to run (no Python, no transformers), the port erroring or misreading its
/// parameters: a wrong port is caught only so.
pub fn on_values(failure: &golden::Failure) -> bool {
    failure.case_failure().is_some_and(|c| {
        c.port.is_none()
            && c.reference_error.is_none()
            && c.params.is_empty()
            && c.leaves.iter().any(|leaf| !leaf.passes())
    })
}

/// The check of the port `name`: a right port passes; a wrong one is caught on its values, and
/// golden names no cause other than its mistake. Prints the message and the time.
pub fn held_out(name: &str) {
    let p = held_out_ports::named(name);
    let (failure, took) = run(&p);
    let kind = p.kind.label();
    if p.mistake.is_none() {
        if let Some(f) = failure {
            panic!("the right port `{name}` failed its {kind} check:\n{f}");
        }
        println!(
            "`{name}` passes its {kind} check ({:.1} s)",
            took.as_secs_f64()
        );
        return;
    }
    let failure =
        failure.unwrap_or_else(|| panic!("the wrong port `{name}` passed its {kind} check"));
    let msg = failure.to_string();
    println!(
        "`{name}` ({kind}), caught in {:.1} s:\n{msg}\n",
        took.as_secs_f64()
    );
    assert!(
        on_values(&failure),
        "`{name}` failed its {kind} check, but not on its values:\n{msg}"
    );
    let verdict = Verdict::of(&p, &msg);
    assert!(
        verdict.wrong.is_empty(),
        "golden names a cause other than `{name}`'s mistake (expected one of {:?}):\n  {}\n\n{msg}",
        p.causes,
        verdict.wrong.join("\n  ")
    );
}

/// Every port of `round` has its test in `tested`, and the set is what the issue asks for: at
/// least 24 wrong ports on at least four families, at least a third of them (and at least 8)
/// configuration or structure mistakes, at least six through `decode(...)`, and a right port per
/// family.
pub fn assert_the_set(round: Round, tested: &[&str]) {
    use held_out_ports::{Class, Kind};
    let (wrong, right) = (held_out_ports::wrong(round), held_out_ports::right(round));
    let mut names: Vec<&str> = wrong.iter().chain(&right).map(|p| p.name).collect();
    names.sort_unstable();
    let mut tested = tested.to_vec();
    tested.sort_unstable();
    assert_eq!(
        names, tested,
        "a port without its test, or a test without its port"
    );
    let families = |ports: &[HeldOut]| {
        let mut f: Vec<&str> = ports.iter().map(|p| p.family).collect();
        f.dedup();
        f
    };
    assert!(wrong.len() >= 24, "{} wrong ports", wrong.len());
    assert!(families(&wrong).len() >= 4);
    assert_eq!(families(&wrong), families(&right));
    let config_or_structure = wrong
        .iter()
        .filter(|p| matches!(p.mistake, Some(Class::Configuration | Class::Structure)))
        .count();
    assert!(
        config_or_structure >= 8 && 3 * config_or_structure >= wrong.len(),
        "{config_or_structure} of {}",
        wrong.len()
    );
    assert!(wrong.iter().filter(|p| p.kind == Kind::Decode).count() >= 6);
    assert!(wrong
        .iter()
        .all(|p| p.mistake.is_some() && !p.causes.is_empty()));
    assert!(right.iter().all(|p| p.mistake.is_none()));
}

/// The measurement of `round`: every wrong port's check, what golden named first and whether it
/// is the planted mistake, how long the failing check took; per family and overall, the share
/// named and the wrong causes; and whether each family's right ports pass. Printed as Markdown
/// on stdout; the messages go to stderr.
pub fn table(round: Round) {
    struct Row {
        family: &'static str,
        named: &'static str,
        wrong: usize,
    }
    let mut rows = Vec::new();
    let mut table = vec![
        "| family | port | check | mistake | caught | named | wrong causes | time | first likely cause |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for p in held_out_ports::wrong(round) {
        let (failure, took) = run(&p);
        let (caught, verdict) = match &failure {
            None => ("no", None),
            Some(f) if !on_values(f) => {
                eprintln!("{} failed, not on its values:\n{f}\n", p.name);
                ("not on values", None)
            }
            Some(f) => {
                let msg = f.to_string();
                eprintln!(
                    "{} ({}), {:.1} s:\n{msg}\n",
                    p.name,
                    p.kind.label(),
                    took.as_secs_f64()
                );
                ("yes", Some(Verdict::of(&p, &msg)))
            }
        };
        let named = verdict.as_ref().map_or("no", Verdict::named);
        let wrong = verdict.as_ref().map_or(0, |v| v.wrong.len());
        let first = verdict
            .as_ref()
            .and_then(|v| v.causes.first().cloned())
            .unwrap_or_else(|| "(none)".into());
        table.push(format!(
            "| {} | {} | {} | {} | {caught} | {named} | {wrong} | {:.1} s | {} |",
            p.family,
            p.name,
            p.kind.label(),
            p.mistake.map_or("", |c| c.label()),
            took.as_secs_f64(),
            first
                .replace('|', "\\|")
                .chars()
                .take(300)
                .collect::<String>()
        ));
        rows.push(Row {
            family: p.family,
            named,
            wrong,
        });
    }
    let mut right_passed: Vec<(&str, usize, usize)> = Vec::new();
    for p in held_out_ports::right(round) {
        let (failure, _) = run(&p);
        if let Some(f) = &failure {
            eprintln!("the right port {} failed:\n{f}\n", p.name);
        }
        match right_passed.iter_mut().find(|(f, ..)| *f == p.family) {
            Some(entry) => {
                entry.1 += usize::from(failure.is_none());
                entry.2 += 1;
            }
            None => right_passed.push((p.family, usize::from(failure.is_none()), 1)),
        }
    }
    println!("{}", table.join("\n"));
    println!();
    println!("| family | named (first cause) | wrong causes (ports) | right ports pass |");
    println!("|---|---|---|---|");
    let summary = |rows: &[&Row]| {
        let named = rows.iter().filter(|r| r.named == "yes").count();
        let wrong = rows.iter().filter(|r| r.wrong > 0).count();
        (named, wrong, rows.len())
    };
    for (family, passed, total) in &right_passed {
        let of: Vec<&Row> = rows.iter().filter(|r| r.family == *family).collect();
        let (named, wrong, n) = summary(&of);
        println!(
            "| {family} | {named}/{n} ({:.0} %) | {wrong} | {passed}/{total} |",
            100.0 * named as f64 / n as f64
        );
    }
    let all: Vec<&Row> = rows.iter().collect();
    let (named, wrong, n) = summary(&all);
    let (passed, total) = right_passed
        .iter()
        .fold((0, 0), |(p, t), (_, pp, tt)| (p + pp, t + tt));
    println!(
        "| all | {named}/{n} ({:.0} %) | {wrong} | {passed}/{total} |",
        100.0 * named as f64 / n as f64
    );
}
