//! Careless values of golden's environment variables and of a check's sizes end in a clear error
//! naming the variable, what is wrong and the accepted form — never in a run of zero cases that
//! passes, a silently ignored value, or an allocation that aborts the test binary. A test binary of
//! its own: it sets variables that every check of the process reads, so its tests take turns.

mod common;

use common::Scratch;
use golden::internal::describe::env::Mode;
use golden::{Dist, IntoOutputs, Layer, PortInputs, Report};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn gelu(scratch: &Scratch) -> Layer {
    Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .cases(4)
        .declared_at(scratch.declared)
        .mode(Mode::Live)
}

fn right(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).gelu_erf().into_outputs()
}

/// Run `layer`'s check with the variables `vars` set (and unset after); a failure as its message.
fn with_env(vars: &[(&str, &str)], layer: &Layer) -> Result<Report, String> {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let result = golden::check(layer, &right).map_err(|f| f.to_string());
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    result
}

fn error(vars: &[(&str, &str)], layer: &Layer) -> String {
    match with_env(vars, layer) {
        Ok(r) => panic!(
            "{vars:?} passed with {} cases",
            r.runs.iter().map(|r| r.cases.len()).sum::<usize>()
        ),
        Err(msg) => msg,
    }
}

#[test]
fn zero_cases_is_an_error_not_a_pass() {
    let scratch = Scratch::new("zero_cases");
    let msg = error(&[("GOLDEN_CASES", "0")], &gelu(&scratch));
    assert!(
        msg.contains("GOLDEN_CASES=\"0\"") && msg.contains("at least 1"),
        "{msg}"
    );
    let msg = error(&[("GOLDEN_CASES", "many")], &gelu(&scratch));
    assert!(msg.contains("GOLDEN_CASES=\"many\""), "{msg}");
}

#[test]
fn golden_case_naming_a_dtype_the_check_does_not_test_is_an_error() {
    let scratch = Scratch::new("case_dtype");
    let msg = error(
        &[("GOLDEN_CASE", "b=1,n=3:declared:0x1:f64")],
        &gelu(&scratch),
    );
    assert!(
        msg.contains("GOLDEN_CASE") && msg.contains("f64") && msg.contains("checks only f32"),
        "{msg}"
    );
    let msg = error(
        &[("GOLDEN_CASE", "b=1,n=3:declared:0x1:f8")],
        &gelu(&scratch),
    );
    assert!(
        msg.contains("`f8` is not a dtype") && msg.contains("f32, f64, f16, bf16"),
        "{msg}"
    );
}

#[test]
fn golden_case_dims_outside_their_range_or_unknown_are_errors() {
    let scratch = Scratch::new("case_dims");
    for (value, shown) in [("0", "0"), ("4000000000", "4000000000")] {
        let token = format!("b=1,n={value}:declared:0x1:f32");
        let msg = error(&[("GOLDEN_CASE", &token)], &gelu(&scratch));
        assert!(
            msg.contains(&format!(
                "dim `n`={shown} is outside its declared range 1..=64"
            )),
            "{msg}"
        );
    }
    let msg = error(
        &[("GOLDEN_CASE", "b=1,n=3,q=2:declared:0x1:f32")],
        &gelu(&scratch),
    );
    assert!(
        msg.contains("`q` is not a dim of `gelu` (its dims: b, n)"),
        "{msg}"
    );
    let msg = error(
        &[("GOLDEN_CASE", "b=1,n=3,n=4:declared:0x1:f32")],
        &gelu(&scratch),
    );
    assert!(msg.contains("dim `n` is given twice"), "{msg}");
}

#[test]
fn golden_seed_takes_the_hex_form_failures_print_and_decimal() {
    let scratch = Scratch::new("seed_forms");
    for (value, seed) in [
        ("0x4934c9de9c8e41db", 0x4934_c9de_9c8e_41db_u64),
        ("0X2A", 42),
        ("42", 42),
    ] {
        let report =
            with_env(&[("GOLDEN_SEED", value)], &gelu(&scratch)).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(report.seed, seed, "{value}");
    }
    let msg = error(&[("GOLDEN_SEED", "0xnope")], &gelu(&scratch));
    assert!(
        msg.contains("GOLDEN_SEED=\"0xnope\"")
            && msg.contains("decimal (42) or hexadecimal (0x2a)"),
        "{msg}"
    );
}

#[test]
fn a_declared_size_beyond_the_memory_budget_is_an_error_not_an_abort() {
    let scratch = Scratch::new("huge_dims");
    let layer = Layer::function("huge", "zoo_ref.gelu")
        .dim("n", 1, 100_000)
        .arg("x", ["n", "n"], Dist::default())
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    let msg = error(&[], &layer);
    assert!(
        msg.contains("argument `x` [n, n]")
            && msg.contains("n=100000")
            && msg.contains("10000000000 elements")
            && msg.contains("GOLDEN_MEMORY_LIMIT"),
        "{msg}"
    );
}

#[test]
fn record_mode_stops_at_the_store_s_bound() {
    let scratch = Scratch::new("record_bound");
    let layer = gelu(&scratch).mode(Mode::Record);
    let report = with_env(
        &[("GOLDEN_CASES", "2000"), ("GOLDEN_STORE_LIMIT", "0.02")],
        &layer,
    )
    .unwrap_or_else(|f| panic!("{f}"));
    let stored = golden::internal::answers::store::Store::load(&scratch.store(&layer))
        .unwrap()
        .expect("recorded");
    let run = &report.runs[0];
    assert!(!stored.is_empty() && stored.len() < 100, "{}", stored.len());
    // The port ran on the recorded cases only; the rest were neither evaluated nor checked.
    assert_eq!(run.cases.len(), stored.len());
    assert_eq!(run.skipped, 2000 - stored.len());
}

/// A port that is wrong everywhere: under a sound declaration it cannot pass.
fn zeros(i: &PortInputs) -> Result<golden::Outputs, String> {
    i.tensor(0).zeros_like().into_outputs()
}

/// Declarations under which no wrong port can fail (#21 item 5): `uniform(-inf, inf)` makes every
/// input NaN (NaN matched NaN), `uniform(0, 0)` every input 0 (a wrong GELU is 0 there too),
/// `dims(n = 0..=0)` every input empty (nothing compared), a NaN or negative tolerance, a NaN
/// mean. Each is an error naming the option before any case runs, never a pass.
#[test]
fn degenerate_declarations_are_refused_naming_the_option() {
    let scratch = Scratch::new("degenerate");
    let with = |dist: Dist| {
        Layer::function("degenerate", "zoo_ref.gelu")
            .dim("b", 1, 4)
            .dim("n", 1, 16)
            .arg("x", ["b", "n"], dist)
            .cases(16)
            .declared_at(scratch.declared)
            .mode(Mode::Live)
    };
    let refused = |layer: &Layer, why: &str| {
        let msg = match golden::check(layer, &zeros) {
            Ok(r) => panic!(
                "`{why}` passed a wrong port with {} cases",
                r.runs.iter().map(|r| r.cases.len()).sum::<usize>()
            ),
            Err(f) => f.to_string(),
        };
        assert!(msg.contains(why), "expected `{why}` in:\n{msg}");
        assert!(
            !msg.contains("does not match"),
            "refused before any case ran:\n{msg}"
        );
    };
    let inf = f64::INFINITY;
    refused(
        &with(Dist::uniform(-inf, inf)),
        "argument `x` ~ uniform(-inf, inf): its bounds must be finite",
    );
    refused(
        &with(Dist::uniform(0.0, 0.0)),
        "argument `x` ~ uniform(0.0, 0.0): an empty range (lo must be below hi)",
    );
    refused(
        &with(Dist::uniform(1.0, 1.0 + 1e-12)),
        "argument `x` ~ uniform(1.0, 1.000000000001): every value rounds to one f32",
    );
    refused(
        &with(Dist::uniform(-1e39, 1e39)),
        "argument `x` ~ uniform(-1e39, 1e39): beyond f32's finite range",
    );
    refused(
        &with(Dist::normal(f64::NAN, 1.0)),
        "argument `x` ~ normal(NaN, 1.0): its mean and spread must be finite",
    );
    refused(
        &with(Dist::normal(0.0, -1.0)),
        "argument `x` ~ normal(0.0, -1.0): a negative spread",
    );
    let empty = Layer::function("degenerate", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 0, 0)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    refused(
        &empty,
        "dim `n` = 0..=0 is always 0: every tensor with that axis is empty in every case",
    );
    refused(
        &with(Dist::default()).tol(f64::NAN, f64::NAN),
        "tol(atol = NaN, rtol = NaN): a tolerance must be finite and not negative",
    );
    refused(
        &with(Dist::default()).tol(-1.0, -1.0),
        "tol(atol = -1, rtol = -1): a tolerance must be finite and not negative",
    );
    refused(
        &with(Dist::default()).tol(f64::INFINITY, 0.0),
        "tol(atol = inf, rtol = 0): a tolerance must be finite and not negative",
    );
}

/// A check whose every case compared no element (every output empty) never reports a match,
/// whatever made them empty (#21 item 5: a comparison that compared nothing).
#[test]
fn a_check_that_compared_no_element_fails() {
    let scratch = Scratch::new("nothing_compared");
    // `n` may be 0 (a fine range), but an expression keeps the second axis at 0 in every case.
    let layer = Layer::function("nothing", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 3)
        .arg(
            "x",
            [
                golden::DimExpr::from("b"),
                golden::DimExpr::Expr(golden::DimValue::Sub(
                    Box::new(golden::DimValue::dim("n")),
                    Box::new(golden::DimValue::Lit(5)),
                )),
            ],
            Dist::default(),
        )
        .cases(4)
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    let msg = match golden::check(&layer, &zeros) {
        Ok(_) => panic!("a check that compared nothing passed"),
        Err(f) => f.to_string(),
    };
    assert!(
        msg.contains("compared no element in its 4 f32 cases: every output leaf was empty"),
        "{msg}"
    );
}

/// `GOLDEN_VARIANTS`, `GOLDEN_SHARED_WORKER` and `GOLDEN_SHARED_IDLE` ignored values they could
/// not read (#21 item 14): `GOLDEN_VARIANTS=of` left the variants on, `GOLDEN_SHARED_WORKER=yes`
/// meant "auto", `GOLDEN_SHARED_IDLE=-5` the default. Each is an error naming the variable, the
/// value and the accepted form, like every other variable's.
#[test]
fn variants_and_shared_worker_variables_are_read_strictly() {
    let scratch = Scratch::new("strict_vars");
    for (var, value, accepted) in [
        ("GOLDEN_VARIANTS", "of", "is not one of on, off"),
        (
            "GOLDEN_SHARED_WORKER",
            "yes",
            "is not one of auto, always, never",
        ),
        (
            "GOLDEN_SHARED_IDLE",
            "-5",
            "is not a number of seconds: give a positive number",
        ),
    ] {
        let msg = error(&[(var, value)], &gelu(&scratch));
        assert!(
            msg.contains(&format!("{var}={value:?} {accepted}")),
            "{var}: {msg}"
        );
    }
    for (var, value) in [
        ("GOLDEN_VARIANTS", "off"),
        ("GOLDEN_SHARED_WORKER", "never"),
        ("GOLDEN_SHARED_IDLE", "2.5"),
    ] {
        with_env(&[(var, value)], &gelu(&scratch)).unwrap_or_else(|f| panic!("{var}: {f}"));
    }
}

/// #31 item 7: after a failing 200 MB output golden still worked past 200 s — shrinking, other
/// failing cases, the diagnoses of each, the known variants, the mutation diagnosis, each a whole
/// evaluation of the output. The work after a failure is bounded by the output's size
/// (`GOLDEN_FAILURE_BUDGET`, elements in millions), and the failure says what it skipped. Here the
/// budget (a million elements) is below one more case of the output (2^20 elements): nothing but
/// the failure itself is evaluated; a right port passes as before.
#[test]
fn the_work_after_a_failure_is_bounded_by_the_output_s_size() {
    let scratch = Scratch::new("big_output");
    let layer = Layer::function("big_output", "torch.clone")
        .dim("n", 1 << 20, 1 << 20)
        .arg("x", ["n"], Dist::default())
        .cases(4)
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    let run = |port: fn(&PortInputs) -> Result<golden::Outputs, String>| {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("GOLDEN_FAILURE_BUDGET", "1");
        let result = golden::check(&layer, &port).map_err(Box::new);
        std::env::remove_var("GOLDEN_FAILURE_BUDGET");
        result
    };
    let failure = match run(|i| (i.tensor(0) * 2.0).into_outputs()) {
        Ok(_) => panic!("a port that doubles its input passed `torch.clone`"),
        Err(f) => f,
    };
    let msg = failure.to_string();
    assert!(
        msg.contains("golden: `big_output` does not match its reference `torch.clone`")
            && msg.contains("leaf `out`"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "note: the failing output has 1048576 elements, and what golden evaluates after a \
             failure is bounded by the output's size (GOLDEN_FAILURE_BUDGET=1: 1000000 elements, \
             about 0.95 cases of this size): skipped shrinking (no smaller case tried)"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("shrinking (no smaller case tried)")
            && msg.contains("another failing case")
            && msg.contains("the mutation diagnosis"),
        "{msg}"
    );
    // Not shrunk: the failure is the first failing case, as it happened.
    assert_eq!(
        failure.shrunk_from.as_ref().map(|(_, steps)| *steps),
        Some(0)
    );
    run(|i| i.tensor(0).clone().into_outputs()).unwrap_or_else(|f| panic!("{f}"));
}
