//! The mistakes porters made on Gemma 2 and CLIP, as ports of the real `transformers` modules
//! (`tests/common/porter_ports.rs`): each wrong port must fail with its cause named first and the
//! reference's line, on two failing cases, with the fix; each right port must pass with nothing
//! reported. None of these mistakes is an entry of golden's catalogue: the operator-level families
//! (`reference_py/golden_ref/families.py`, `structure.py`) find them. Live: the mutants run in
//! the Python worker; variants off, so that the diagnosis stands on its own.

mod common;

use common::porter_ports::{self, PorterPort};
use golden::internal::describe::env::Mode;
use golden::internal::judge::mutations::MutationMatch;

/// The port's check, live, variants off; `Some` with the failure.
fn check(p: &PorterPort) -> Option<golden::Failure> {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let scratch = common::Scratch::new(p.layer.name());
    let layer = common::declared_with_store(&p.layer, &scratch).mode(Mode::Live);
    let port = p.port.clone();
    golden::check(&layer, &move |i: &golden::PortInputs| port(i)).err()
}

fn named(m: &MutationMatch, expected: &[(&str, &str)]) -> bool {
    expected
        .iter()
        .any(|(cause, site)| m.what.contains(cause) && m.site.contains(site))
}

/// The wrong port fails; its first likely cause is one of those expected, on both failing cases,
/// with the reference's line and a fix.
fn expect(p: PorterPort) {
    let failure = check(&p).unwrap_or_else(|| panic!("the wrong port `{}` passed", p.layer.name()));
    let msg = failure.to_string();
    let found = failure
        .case_failure()
        .map(|c| c.mutations.clone())
        .unwrap_or_default();
    let first = found
        .first()
        .unwrap_or_else(|| panic!("nothing named:\n{msg}"));
    assert!(
        named(first, &p.expected),
        "{:?} not named first:\n{msg}",
        p.expected
    );
    assert!(first.both_cases, "{msg}");
    assert!(
        (msg.contains("likely cause: the port matches the reference with ")
            || msg.contains("likely cause: the port behaves as if "))
            && msg.contains(" on both failing cases (max diff ")
            && msg.contains(" — fix: "),
        "{msg}"
    );
    // No wrong guess beside it: the numbers' hypotheses lose to a mutant that holds.
    assert!(!msg.contains("likely causes:"), "{msg}");
}

macro_rules! porter_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            expect(porter_ports::$name());
        }
    )*};
}

porter_tests![
    gemma_rms_norm_weight_not_one_plus,
    gemma_without_soft_capping,
    gemma_sliding_window_one_wider,
    gemma_scaled_by_head_dim,
    gemma_embedding_unscaled,
    gemma_mlp_with_erf_gelu,
    gemma_without_post_feedforward_norm,
    clip_mlp_with_gelu,
    clip_class_token_appended,
    clip_positions_off_by_one,
    new_gelu_as_erf,
];

/// The right ports pass, and nothing is diagnosed (the diagnosis runs only on a failure).
#[test]
fn the_right_ports_pass() {
    for p in porter_ports::right() {
        if let Some(f) = check(&p) {
            panic!("the right port `{}` failed:\n{f}", p.layer.name());
        }
    }
}

/// What each wrong port's failure says (printed, for review: `--ignored --nocapture`).
#[test]
#[ignore = "prints the messages"]
fn print_the_messages() {
    for (name, p) in porter_ports::wrong() {
        match check(&p) {
            None => eprintln!("{name}: passed"),
            Some(f) => eprintln!("{name}:\n{f}\n"),
        }
    }
}
