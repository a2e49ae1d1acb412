//! Traces find where a whole model first leaves its reference: the zoo's TinyLM with a bug planted
//! in block 2 (attention without its causal mask) is reported at block 2's attention, not at a later
//! point, with the trace table, the drift line and the points the port did not tap; its failure
//! artifacts hold both traces numbered in execution order. A tap with a name the reference does
//! not have is an error. Stores in `tests/golden/`.

mod common;

use candle_core::Module;
use golden::{IntoOutputs, PortInputs};
use golden_zoo::model::TinyLm;

use common::tiny_lm::{layer, CONFIG};

#[test]
fn a_bug_in_block_2_is_found_at_block_2() {
    let f = common::must_fail(&layer("t_tiny_lm_block2"), |i| {
        TinyLm::new(i.var_builder(), CONFIG)?
            .with_bug_in_block(2)
            .forward(i.tensor(0))
    });
    let msg = f.to_string();
    // The headline names the first divergent point: block 2's attention (its projection is the
    // first submodule whose output the missing mask changes).
    let headline = msg.lines().next().unwrap();
    assert!(
        headline.starts_with(
            "golden: `t_tiny_lm_block2` leaves its reference `zoo_ref.TinyLM` at `blocks.2.attn.proj`"
        ),
        "{msg}"
    );
    // Every point before it matched; the table marks the first divergence and lists later ones.
    let table_start = msg
        .find("the trace, in the reference's execution order")
        .expect(&msg);
    let table = &msg[table_start..];
    for ok in [
        "tok",
        "blocks.0",
        "blocks.1",
        "blocks.2.ln1",
        "blocks.2.attn.qkv",
    ] {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(ok))
            .unwrap_or_else(|| panic!("no line for {ok}:\n{table}"));
        assert!(line.trim_end().ends_with("ok"), "{line}");
    }
    assert!(table.contains("DIFFERS  <- first divergence"), "{table}");
    assert!(msg.contains("drift against depth: ▁"), "{msg}");
    // The port taps neither Linear of the MLPs: listed, not failed.
    assert!(
        msg.contains(
            "not tapped by the port (8 reference points): blocks.0.mlp.fc1, blocks.0.mlp.fc2"
        ),
        "{msg}"
    );
    // Only the first divergent point is detailed among the trace leaves.
    assert!(msg.contains("leaf `trace.blocks.2.attn.proj`"), "{msg}");
    assert!(!msg.contains("leaf `trace.blocks.3"), "{msg}");

    // The artifacts: both traces, numbered in execution order.
    let dir = msg.lines().last().unwrap().trim();
    let names = |side: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(format!("{dir}/trace/{side}"))
            .unwrap_or_else(|e| panic!("{dir}/trace/{side}: {e}"))
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let reference = names("reference");
    assert_eq!(reference.len(), 39, "{reference:?}");
    assert_eq!(reference[0], "000_tok.npy");
    assert!(
        reference.contains(&"021_blocks.2.attn.proj.npy".to_string()),
        "{reference:?}"
    );
    assert_eq!(names("port").len(), 31);

    // `golden diff` on the two dump folders finds the same first divergence.
    let trace = std::path::Path::new(dir).join("trace");
    let diff = golden_cli::diff::run(
        &trace.join("reference"),
        &trace.join("port"),
        golden_cli::diff::Tolerance::default(),
        &golden_cli::read::ReadOptions::default(),
    )
    .unwrap();
    let (at, row) = diff.first_divergence().expect("a divergence");
    assert_eq!(row.name, "021_blocks.2.attn.proj");
    assert_eq!(at, 21, "{}", diff.text());
    assert!(!diff.all_match());
}

#[test]
fn a_tap_the_reference_does_not_have_is_an_error() {
    let f = common::must_fail(&layer("t_tiny_lm_typo"), |i| {
        let logits = TinyLm::new(i.var_builder(), CONFIG)?.forward(i.tensor(0))?;
        golden::tap("blocks.0.atn", &logits);
        Ok(logits)
    });
    let msg = f.to_string();
    assert!(
        msg.contains("leaf `trace.blocks.0.atn` (f32 [1, 1, 32]): the port returns it, the reference does not"),
        "{msg}"
    );
}

#[test]
fn taps_outside_a_traced_check_do_nothing() {
    // The zoo's TransformerBlock taps its parts; its own (untraced) check compares only `out`.
    let layer = common::tiny_lm::untraced_block_layer();
    let scratch = common::Scratch::new("t_untraced_block");
    let layer = common::declared_with_store(&layer, &scratch);
    let port = |i: &PortInputs| {
        golden_zoo::blocks::TransformerBlock::new(i.var_builder(), 32, 4, 64)
            .and_then(|b| b.forward(i.tensor(0)))
            .into_outputs()
    };
    let report = golden::check(&layer, &port).unwrap_or_else(|f| panic!("{f}"));
    let leaves: Vec<&str> = report.runs[0].cases[0]
        .leaves
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(leaves, ["out"]);
}
