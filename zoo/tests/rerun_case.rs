//! The command a failure prints re-runs exactly its case. A test binary of its own: it sets
//! `GOLDEN_CASE`, which every check in the process reads.

mod common;

use golden::internal::describe::env::Mode;
use golden::{Dist, IntoOutputs, Layer, PortInputs};

#[test]
fn golden_case_reruns_exactly_the_printed_case() {
    let scratch = common::Scratch::new("rerun_case");
    let layer = Layer::function("gelu", "zoo_ref.gelu")
        .dim("b", 1, 4)
        .dim("n", 1, 64)
        .arg("x", ["b", "n"], Dist::default())
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    let wrong = |i: &PortInputs| i.tensor(0).gelu().into_outputs();
    let first = golden::check(&layer, &wrong).expect_err("wrong port");
    let msg = first.to_string();
    let token = msg
        .split("GOLDEN_CASE='")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the message prints the re-run command");
    assert!(token.ends_with(":f32"), "{token}");

    std::env::set_var("GOLDEN_CASE", token);
    let again = golden::check(&layer, &wrong).expect_err("the same case fails again");
    assert_eq!(again.case, first.case);
    assert!(
        again.shrunk_from.is_none(),
        "one case, no generation, no shrinking"
    );
    let numbers = |m: &str| {
        m.lines()
            .filter(|l| l.contains("greatest"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(numbers(&again.to_string()), numbers(&msg));

    // The right port passes that case; the snapshot (of the declared cases) is not compared.
    let right = |i: &PortInputs| i.tensor(0).gelu_erf().into_outputs();
    let report = golden::check(&layer, &right).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(report.runs[0].cases.len(), 1);
    assert!(report.snapshot().is_none());

    // A case of a configuration sweep carries its configuration: the branch where the config's
    // `head_dim` is `hidden / heads` passes a port that assumes it, the other fails, named.
    let scratch = common::Scratch::new("rerun_case_sweep");
    let layer = common::sweep_ports::llama_attention("rerun_head_dim")
        .declared_at(scratch.declared)
        .mode(Mode::Live);
    let assumes = |i: &PortInputs| common::sweep_ports::attention_outputs(i, true);
    std::env::set_var("GOLDEN_CASE", "b=1,t=2,h=2,q=1,head_dim=#0:declared:0x1");
    golden::check(&layer, &assumes).unwrap_or_else(|f| panic!("{f}"));
    std::env::set_var(
        "GOLDEN_CASE",
        "b=1,t=2,h=2,q=1,head_dim=#1:declared:0x1:f32",
    );
    let msg = golden::check(&layer, &assumes)
        .expect_err("the other branch fails")
        .to_string();
    assert!(
        msg.contains("configuration: head_dim = 4 * q * h / h"),
        "{msg}"
    );
    assert!(
        msg.contains("GOLDEN_CASE='b=1,t=2,h=2,q=1,head_dim=#1:declared:0x0000000000000001:f32'"),
        "{msg}"
    );
    std::env::remove_var("GOLDEN_CASE");
}
