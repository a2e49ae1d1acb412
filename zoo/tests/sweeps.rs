//! Configuration sweeps: a `config`, `init` or `consts` value written `one_of(...)` or `lo..=hi`
//! is drawn per case with the dims (`runtime/src/describe/sweep.rs`). Each bug here lives in one
//! branch of a configuration, against the real `transformers` classes: a check of one
//! configuration never sees it, the sweep catches it in its branch and names the configuration,
//! and the right port passes every branch. Runs live and from the stores in `tests/golden/`.

mod common;

use common::sweep_ports::{self, LmBugs};
use common::{declared_with_store, Scratch};
use golden::{Failure, IntoOutputs, Layer, Outputs, PortInputs, Report, Value};

type Port = fn(&PortInputs) -> Result<Outputs, String>;

/// The check of a wrong port, declared with its store in `tests/golden/`: must fail.
fn fails(layer: &Layer, port: Port) -> Failure {
    let scratch = Scratch::new(layer.name());
    match golden::check(&declared_with_store(layer, &scratch), &port) {
        Ok(_) => panic!("the wrong port `{}` passed", layer.name()),
        Err(f) => f,
    }
}

/// The check of a right port: must pass.
fn passes(layer: &Layer, port: Port) -> Report {
    let scratch = Scratch::new(layer.name());
    golden::check(&declared_with_store(layer, &scratch), &port)
        .unwrap_or_else(|f| panic!("the right port `{}` failed:\n{f}", layer.name()))
}

fn attention(i: &PortInputs, from_hidden: bool) -> Result<Outputs, String> {
    sweep_ports::attention_outputs(i, from_hidden)
}

fn lm(i: &PortInputs, bugs: LmBugs) -> Result<Outputs, String> {
    sweep_ports::gemma_lm_port(i, bugs).into_outputs()
}

/// The configurations a passing check covered and how many cases each got, from its cases (the
/// snapshot lists the same, when the declared cases ran: checked too).
fn covered(report: &Report) -> Vec<(String, usize)> {
    let covered = golden::internal::describe::sweep::covered(
        report.runs[0]
            .cases
            .iter()
            .map(|c| c.params.config.as_slice()),
    );
    if let Some(snapshot) = report.snapshot() {
        for (configuration, n) in &covered {
            assert!(
                snapshot.contains(&format!("    {configuration}: {n}\n")),
                "{configuration}: {snapshot}"
            );
        }
    }
    covered
}

#[test]
fn a_port_reading_hidden_over_heads_fails_where_the_config_s_head_dim_differs() {
    let msg = fails(
        &sweep_ports::llama_attention("w_head_dim_from_hidden"),
        |i| attention(i, true),
    )
    .to_string();
    println!("{msg}");
    // The failing branch, named: the configuration whose head_dim is twice hidden / heads; the
    // branch where they agree passed.
    assert!(
        msg.contains(
            "configuration: head_dim = 4 * q * h / h; passed before with head_dim=2 * q * h / h ("
        ),
        "{msg}"
    );
    assert!(
        msg.contains("config head_dim=4 * q * h / h") && msg.contains(",head_dim=#1:"),
        "{msg}"
    );
    assert!(
        msg.contains("the port asks for `q_proj.weight` with shape")
            && msg.contains("the reference's is"),
        "{msg}"
    );
    let report = passes(&sweep_ports::llama_attention("w_head_dim_right"), |i| {
        attention(i, false)
    });
    let lines = covered(&report);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].0 == "head_dim=2 * q * h / h" && lines[1].0 == "head_dim=4 * q * h / h",
        "{lines:?}"
    );
    assert!(
        report
            .description
            .contains("head_dim = one_of(2 * q * h / h, 4 * q * h / h)"),
        "{}",
        report.description
    );
}

#[test]
fn a_missing_final_soft_cap_is_caught_in_the_capped_branch_only() {
    let msg = fails(&sweep_ports::gemma_lm("w_gemma_lm_no_softcap"), |i| {
        let bugs = LmBugs {
            no_final_softcap: true,
            ..LmBugs::default()
        };
        lm(i, bugs)
    })
    .to_string();
    println!("{msg}");
    assert!(msg.contains("final_logit_softcapping = 30.0"), "{msg}");
    assert!(
        msg.contains("passed before with final_logit_softcapping=None"),
        "{msg}"
    );
    assert!(msg.contains("leaf `out.logits`"), "{msg}");
    // Shrinking keeps the branch that fails; GOLDEN_CASE carries it.
    assert!(msg.contains("final_logit_softcapping=30.0,"), "{msg}");
    // A check of the one configuration a porter tests first never sees it.
    let mut one = sweep_ports::gemma_lm("w_gemma_lm_no_softcap_unswept");
    let swept: Vec<(String, Value)> = one
        .configuration()
        .unwrap()
        .values
        .iter()
        .filter(|(_, v)| v.is_swept())
        .map(|(k, v)| (k.clone(), v.alternative(0)))
        .collect();
    for (k, v) in swept {
        one = one.config_value(&k, v);
    }
    passes(&one, |i| {
        let bugs = LmBugs {
            no_final_softcap: true,
            ..LmBugs::default()
        };
        lm(i, bugs)
    });
}

#[test]
fn an_untied_lm_head_is_caught_where_the_config_ties_it() {
    let msg = fails(&sweep_ports::gemma_lm("w_gemma_lm_untied"), |i| {
        let bugs = LmBugs {
            untied_head: true,
            ..LmBugs::default()
        };
        lm(i, bugs)
    })
    .to_string();
    println!("{msg}");
    assert!(msg.contains("tie_word_embeddings = true"), "{msg}");
    assert!(
        msg.contains(
            "the port reads `lm_head.weight`, which the reference module ties to \
             `model.embed_tokens.weight`"
        ),
        "{msg}"
    );
}

#[test]
fn the_right_lm_port_passes_every_branch_and_the_snapshot_counts_them() {
    let report = passes(&sweep_ports::gemma_lm("w_gemma_lm_right"), |i| {
        lm(i, LmBugs::default())
    });
    let lines = covered(&report);
    // Two fields of two values: every pair comes up in 12 cases, not more configurations.
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines.iter().map(|(_, n)| n).sum::<usize>(), 12, "{lines:?}");
    for pair in [
        "final_logit_softcapping=None tie_word_embeddings=true",
        "final_logit_softcapping=30.0 tie_word_embeddings=false",
        "final_logit_softcapping=None tie_word_embeddings=false",
        "final_logit_softcapping=30.0 tie_word_embeddings=true",
    ] {
        assert!(lines.iter().any(|(l, _)| l == pair), "{pair}: {lines:?}");
    }
}

#[test]
fn a_case_token_carries_its_configuration_and_reruns_it() {
    // `GOLDEN_CASE` re-runs a case with the configuration it names, by value or by index.
    let scratch = Scratch::new("w_head_dim_token");
    let layer = sweep_ports::llama_attention("w_head_dim_token").declared_at(scratch.declared);
    for token in [
        "b=1,t=2,h=1,q=1,head_dim=#1:declared:0x1",
        "b=1,t=2,h=1,q=1,head_dim=#0:declared:0x1",
    ] {
        let case = golden::internal::describe::inputs::CaseParams::parse(token, &layer).unwrap();
        let again =
            golden::internal::describe::inputs::CaseParams::parse(&case.token(), &layer).unwrap();
        assert_eq!(again, case, "{token}");
        assert_eq!(case.config.len(), 1);
        let resolved = case.layer(&layer);
        let head_dim = resolved
            .configuration()
            .unwrap()
            .values
            .iter()
            .find(|(k, _)| k == "head_dim")
            .map(|(_, v)| v.clone());
        let expected = if token.contains("#1") { 4 } else { 2 };
        assert_eq!(head_dim, Some(Value::Int(expected)), "{token}");
    }
    let err = golden::internal::describe::inputs::CaseParams::parse(
        "b=1,t=2,h=1,q=1:declared:0x1",
        &layer,
    )
    .unwrap_err();
    assert!(
        err.contains("the swept value `head_dim` is missing"),
        "{err}"
    );
    let err = golden::internal::describe::inputs::CaseParams::parse(
        "b=1,t=2,h=1,q=1,head_dim=#2:declared:0x1",
        &layer,
    )
    .unwrap_err();
    assert!(err.contains("alternatives #0 to #1"), "{err}");
}

#[test]
fn malformed_sweeps_are_refused_before_any_case_runs() {
    let port = |i: &PortInputs| i.tensor(0).clone().into_outputs();
    let base = || {
        golden::Layer::function("w_bad", "zoo_ref.gelu")
            .dim("n", 1, 4)
            .arg("x", ["n"], golden::Dist::default())
    };
    let cases = [
        (
            base().konst("a", Value::one_of([])),
            "`a = one_of()` has no values to draw from",
        ),
        (
            base().konst("n", Value::one_of([1.into(), 2.into()])),
            "`n` is both a dim and a swept value",
        ),
        (
            base()
                .konst("a", Value::one_of((0..5).map(Value::from)))
                .cases(3),
            "`cases = 3` cannot try each value of `a = one_of(0, 1, 2, 3, 4)`: give `cases = 5`",
        ),
        (
            base().konst("a", Value::List(vec![Value::one_of([1.into(), 2.into()])])),
            "go at the top of a value",
        ),
        (
            base().dim("z", 0, 2).konst(
                "a",
                Value::Dims(golden::DimValue::Div(
                    Box::new(golden::DimValue::dim("n")),
                    Box::new(golden::DimValue::dim("z")),
                )),
            ),
            "divides by `z`, which can be 0",
        ),
    ];
    for (layer, why) in cases {
        let msg = golden::check(&layer, &port).expect_err(why).to_string();
        assert!(msg.contains(why), "{why}: {msg}");
    }
}
