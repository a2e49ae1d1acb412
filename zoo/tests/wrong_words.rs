//! Issue #30, "wrong or wasted words": mistakes golden catches, whose failure then says something
//! wrong about them, or spends its time on a search that cannot succeed. On the GPT-NeoX port of
//! `tests/common/neox_ports.rs`, against transformers' own classes:
//!
//! - a LayerNorm bias the port never reads, checked forward, with gradients and by training;
//! - an attention port returning `(out, probs)` where `GPTNeoXAttention` returns `(out, None)`;
//! - a `GPTNeoXForCausalLM` port returning the bare logits where the reference returns a
//!   `CausalLMOutputWithPast` (leaf `logits`).
//!
//! Each test asserts that the wrong port is caught and prints golden's whole message; what a user
//! needs to read, where golden does not say it yet, is asserted by an ignored test. Live, variants
//! off; the right ports pass in `tests/neox.rs`.

mod common;

use common::assert_named;
use common::neox_ports::{self as neox, Neox, Port};
use golden::internal::describe::env::Mode;
use golden::{GradSpec, Layer, OverfitSpec};

/// A check of a port, live, variants off; `check` is `golden::check`, `check_gradients` or
/// `check_overfit`. The wrong port must fail: its message, printed.
fn caught(check: common::CheckFn, layer: Layer, port: Port) -> String {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let scratch = common::Scratch::new(layer.name());
    let layer = common::declared_with_store(&layer, &scratch).mode(Mode::Live);
    let start = std::time::Instant::now();
    let failure = match check(&layer, &move |i: &golden::PortInputs| port(i)) {
        Ok(_) => panic!("the wrong port `{}` passed", layer.name()),
        Err(f) => f,
    };
    let msg = failure.to_string();
    println!(
        "{} caught in {:.1} s:\n{msg}\n",
        layer.name(),
        start.elapsed().as_secs_f64()
    );
    msg
}

const MODELING: &str = "transformers/models/gpt_neox/modeling_gpt_neox.py";

/// The causal LM whose layers' `input_layernorm` never read their bias.
fn bias_unread() -> Port {
    neox::causal_lm(Neox {
        input_norm_bias_unread: true,
        ..Neox::default()
    })
}

/// What a user needs of a LayerNorm bias the port never reads, whichever check finds it: no guess
/// about a Linear (`linear_no_bias` has nothing to do with it), and no gradient or training
/// finding that blames a fused op or a detach for a parameter that is simply never read.
fn assert_unread_bias_not_misnamed(msg: &str) {
    assert!(!msg.contains("linear_no_bias"), "{msg}");
    let blamed = msg.lines().any(|l| {
        l.contains("input_layernorm.bias`")
            && (l.contains("fused op without backward") || l.contains("a detach"))
    });
    assert!(!blamed, "{msg}");
}

// --- a parameter the port never reads ------------------------------------------------------------

fn unread_forward() -> String {
    caught(
        golden::check,
        neox::causal_lm_layer("ww_unread_bias"),
        bias_unread(),
    )
}

#[test]
fn a_layer_norm_bias_never_read_is_caught_by_the_forward_check() {
    let msg = unread_forward();
    assert!(
        msg.contains(
            "the reference's state_dict has `gpt_neox.layers.0.input_layernorm.bias` [32], which \
             the port never reads"
        ),
        "{msg}"
    );
}

#[test]
fn a_layer_norm_bias_never_read_is_named_as_such_by_the_forward_check() {
    // The mutation names it (the line below); the state_dict's note says whose bias it is (a
    // norm's, by the weight beside it), not a Linear's.
    let msg = unread_forward();
    assert!(msg.contains("a norm's forgotten bias?"), "{msg}");
    assert_named(
        &msg,
        "F.layer_norm without its bias",
        &format!("{MODELING}:250"),
    );
    assert_unread_bias_not_misnamed(&msg);
}

fn unread_gradients() -> String {
    caught(
        golden::check_gradients,
        neox::causal_lm_layer("ww_unread_bias_grad").grad(GradSpec::default()),
        bias_unread(),
    )
}

#[test]
fn a_layer_norm_bias_never_read_is_caught_by_the_gradient_check() {
    unread_gradients();
}

#[test]
fn a_layer_norm_bias_never_read_is_named_as_such_by_the_gradient_check() {
    // It was: "gets a gradient in PyTorch and none in the port: the gradient stops somewhere,
    // usually at a fused op without backward ... or at a detach" — the port never reads it.
    let msg = unread_gradients();
    assert_unread_bias_not_misnamed(&msg);
    assert!(
        msg.contains(
            "`gpt_neox.layers.0.input_layernorm.bias` gets a gradient in PyTorch and none in the \
             port: the port never reads it"
        ),
        "{msg}"
    );
}

fn unread_overfit() -> String {
    caught(
        golden::check_overfit,
        neox::causal_lm_layer("ww_unread_bias_overfit").overfit(OverfitSpec::default()),
        bias_unread(),
    )
}

#[test]
fn a_layer_norm_bias_never_read_is_caught_by_the_training_check() {
    unread_overfit();
}

#[test]
fn a_layer_norm_bias_never_read_is_named_as_such_by_the_training_check() {
    // It was: "was never updated in 200 steps: the optimizer does not get it, or no gradient
    // reaches it (a detach, a fused op without backward)".
    let msg = unread_overfit();
    assert_unread_bias_not_misnamed(&msg);
    assert!(msg.contains("the port never reads it"), "{msg}");
}

// --- an output the reference does not have -------------------------------------------------------

/// Named before any case: a structure mismatch is the same on every case, so nothing is shrunk
/// and no mutant of the reference can explain it.
fn assert_named_before_any_case(msg: &str) {
    assert!(!msg.contains("the smallest failing case"), "{msg}");
    assert!(!msg.contains("mutants of its"), "{msg}");
}

fn probabilities_returned() -> String {
    caught(
        golden::check,
        neox::attention_layer("ww_attention_probs"),
        neox::attention_with_probabilities(),
    )
}

#[test]
fn attention_probabilities_where_the_reference_returns_none_are_caught() {
    let msg = probabilities_returned();
    assert!(
        msg.contains("leaf `out.1` (f32 [")
            && msg.contains("the port returns it, the reference does not"),
        "{msg}"
    );
}

#[test]
fn attention_probabilities_where_the_reference_returns_none_are_named() {
    // `GPTNeoXAttention` returns `(attn_output, attn_weights)`, the weights None under sdpa.
    let msg = probabilities_returned();
    assert!(
        msg.contains("returns outputs of another structure than its reference"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the port returns a tuple of 2 (`out.0`, `out.1`), the reference a tuple of 1 \
             (`out.0`) — fix: return a one-element tuple `(t,)`: golden skips the reference's \
             `None` entries"
        ),
        "{msg}"
    );
    assert_named_before_any_case(&msg);
}

fn bare_logits() -> String {
    caught(
        golden::check,
        neox::causal_lm_layer("ww_bare_logits"),
        neox::causal_lm_bare_tensor(),
    )
}

#[test]
fn bare_logits_where_the_reference_returns_a_mapping_are_caught() {
    let msg = bare_logits();
    assert!(
        msg.contains("leaf `out.logits` (f32 [")
            && msg.contains("the reference returns it, the port does not"),
        "{msg}"
    );
}

#[test]
fn bare_logits_where_the_reference_returns_a_mapping_are_named() {
    // `GPTNeoXForCausalLM` returns a `CausalLMOutputWithPast`: the port's `out` is its `logits`.
    let msg = bare_logits();
    assert!(
        msg.contains(
            "the port returns a tensor (`out`), the reference a mapping with `logits` \
             (`out.logits`) — fix: return a map from the reference's names: \
             `BTreeMap::from([(\"logits\", logits)])`"
        ),
        "{msg}"
    );
    assert_named_before_any_case(&msg);
}
