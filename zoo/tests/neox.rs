//! Issue #30 ("say why, not only where"), reproduced: a newcomer's GPT-NeoX port
//! (`tests/common/neox_ports.rs`), a model golden had never been run on, against transformers'
//! own `GPTNeoXForCausalLM` and its submodules. The right port passes every kind of check; each of
//! ten realistic mistakes, planted alone, must be caught by every check where it shows, and the
//! failure must say *why*: the likely cause and the reference's line.
//!
//! Where golden names the cause today the test asserts it. Where it does not, the test asserts
//! the cause a user needs (`common::assert_named`) and is ignored until the diagnosis can say it
//! (`cargo test --test neox -- --include-ignored` runs them). Every test prints golden's whole
//! message and how long the failing check took. Live, variants off, as `tests/porters.rs`: the
//! diagnosis needs the reference running.

mod common;

use common::assert_named;
use common::neox_ports::{self as neox, Neox, Port};
use golden::internal::describe::env::Mode;
use golden::{Failure, GradSpec, Layer};
use std::time::{Duration, Instant};

/// The kinds of check a port of a whole model goes through.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `GPTNeoXAttention` on its own.
    Attention,
    /// `GPTNeoXMLP` on its own.
    Mlp,
    /// `GPTNeoXLayer` (the block) on its own.
    Block,
    /// `GPTNeoXForCausalLM`'s logits.
    Model,
    /// The same with `trace`.
    Trace,
    /// The same through `decode(...)`.
    Decode,
}

impl Kind {
    /// The kind a test is named after (`attention`, `mlp`, …).
    fn named(name: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|k| format!("{k:?}").eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("no kind of check `{name}`"))
    }

    const ALL: [Kind; 6] = [
        Kind::Attention,
        Kind::Mlp,
        Kind::Block,
        Kind::Model,
        Kind::Trace,
        Kind::Decode,
    ];

    fn check(self, name: &str, o: Neox) -> (Layer, Port) {
        let name = format!("x_{name}_{self:?}").to_lowercase();
        match self {
            Kind::Attention => (neox::attention_layer(&name), neox::attention(o)),
            Kind::Mlp => (neox::mlp_layer(&name), neox::mlp(o)),
            Kind::Block => (neox::block_layer(&name), neox::block(o)),
            Kind::Model => (neox::causal_lm_layer(&name), neox::causal_lm(o)),
            Kind::Trace => (neox::traced_layer(&name), neox::causal_lm(o)),
            Kind::Decode => (neox::decode_layer(&name), neox::decode(o)),
        }
    }
}

/// The check of `kind` on the port with mistakes `o`, live, variants off: its failure, if any,
/// and how long it took.
fn run(kind: Kind, name: &str, o: Neox) -> (Option<Failure>, Duration) {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let (layer, port) = kind.check(name, o);
    let scratch = common::Scratch::new(layer.name());
    let layer = common::declared_with_store(&layer, &scratch).mode(Mode::Live);
    let start = Instant::now();
    let result = golden::check(&layer, &move |i: &golden::PortInputs| port(i)).err();
    (result, start.elapsed())
}

/// The wrong port fails its check of `kind`; returns the message (printed, with the time).
fn caught(kind: Kind, name: &str, o: Neox) -> String {
    let (failure, took) = run(kind, name, o);
    let failure = failure.unwrap_or_else(|| panic!("`{name}` passed its {kind:?} check"));
    let msg = failure.to_string();
    println!(
        "{name} ({kind:?}), caught in {:.1} s:\n{msg}\n",
        took.as_secs_f64()
    );
    msg
}

/// The first line that says why, for the table of the issue: the first likely cause, else the
/// note of the mutation search, else the last note.
fn first_cause(msg: &str) -> String {
    let lines = || msg.lines().map(str::trim_start);
    lines()
        .find(|l| l.starts_with("likely cause"))
        .or_else(|| lines().find(|l| l.starts_with("note: no single mutation")))
        .or_else(|| lines().rfind(|l| l.starts_with("note:")))
        .unwrap_or("(nothing)")
        .chars()
        .take(400)
        .collect()
}

/// The mistake named `name`.
fn mistake(name: &str) -> Neox {
    mistakes()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no mistake `{name}`"))
        .1
}

/// The ten mistakes, by name.
fn mistakes() -> Vec<(&'static str, Neox)> {
    let d = Neox::default();
    vec![
        (
            "qkv_split_other_order",
            Neox {
                qkv_split_other_order: true,
                ..d
            },
        ),
        (
            "rotary_whole_head",
            Neox {
                rotary_whole_head: true,
                ..d
            },
        ),
        (
            "rotary_interleaved",
            Neox {
                rotary_interleaved: true,
                ..d
            },
        ),
        (
            "sequential_residual",
            Neox {
                sequential_residual: true,
                ..d
            },
        ),
        (
            "mask_one_diagonal_off",
            Neox {
                mask_one_diagonal_off: true,
                ..d
            },
        ),
        (
            "scale_one_over_d",
            Neox {
                scale_one_over_d: true,
                ..d
            },
        ),
        (
            "gelu_tanh",
            Neox {
                gelu_tanh: true,
                ..d
            },
        ),
        (
            "layer_norm_eps_1e6",
            Neox {
                layer_norm_eps_1e6: true,
                ..d
            },
        ),
        (
            "rope_theta_default",
            Neox {
                rope_theta_default: true,
                ..d
            },
        ),
        (
            "heads_merged_untransposed",
            Neox {
                heads_merged_untransposed: true,
                ..d
            },
        ),
    ]
}

// --- the mistakes, check by check ------------------------------------------------------------

/// `mistake_tests!(name { kind: (words, file, line), ... })`: a module of tests `name::kind`,
/// each asserting that the port with the mistake `name` fails its check of `kind` and that a
/// `likely cause:` line of the failure says `words` at `file:line` of the reference. A kind under
/// `#[ignore]` is one golden does not name yet (issue #30); the rest it names today.
macro_rules! mistake_tests {
    ($($mistake:ident { $( $(#[$attr:meta])* $kind:ident: ($words:expr, $file:expr, $line:literal), )* })*) => {$(
        mod $mistake {
            use super::*;
            $(
                #[test]
                $(#[$attr])*
                fn $kind() {
                    let name = stringify!($mistake);
                    let msg = caught(Kind::named(stringify!($kind)), name, mistake(name));
                    assert_named(&msg, $words, &format!("{}:{}", $file, $line));
                }
            )*
        }
    )*};
}

const MODELING: &str = "transformers/models/gpt_neox/modeling_gpt_neox.py";
const SDPA: &str = "transformers/integrations/sdpa_attention.py";

mistake_tests! {
    // Where transformers views the fused projection per head, `[q_h | k_h | v_h]`, and chunks it:
    // `query_states, key_states, value_states = qkv.chunk(3, dim=-1)`.
    qkv_split_other_order {
        attention: ("the fused projection split per tensor", MODELING, 195),
        block: ("the fused projection split per tensor", MODELING, 195),
        model: ("the fused projection split per tensor", MODELING, 195),
        trace: ("the fused projection split per tensor", MODELING, 195),
        decode: ("the fused projection split per tensor", MODELING, 195),
    }

    // Where transformers rotates only the first `rotary_dim` dims of each head:
    // `q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]` (`rotary_dim` is
    // `int(head_dim * partial_rotary_factor)`, the rotary tables' width).
    rotary_whole_head {
        attention: ("`rope_parameters['partial_rotary_factor']` were 1.0", MODELING, 175),
        block: ("`rope_parameters['partial_rotary_factor']` were 1.0", MODELING, 175),
        model: ("`rope_parameters['partial_rotary_factor']` were 1.0", MODELING, 175),
        trace: ("`rope_parameters['partial_rotary_factor']` were 1.0", MODELING, 175),
        decode: ("`rope_parameters['partial_rotary_factor']` were 1.0", MODELING, 175),
    }

    // Where transformers rotates the two halves: `rotate_half`'s `torch.cat((-x2, x1), dim=-1)`.
    rotary_interleaved {
        attention: ("rotary embeddings on interleaved pairs", MODELING, 104),
        block: ("rotary embeddings on interleaved pairs", MODELING, 104),
        model: ("rotary embeddings on interleaved pairs", MODELING, 104),
        trace: ("rotary embeddings on interleaved pairs", MODELING, 104),
        decode: ("rotary embeddings on interleaved pairs", MODELING, 104),
    }

    // Where transformers picks the parallel residual: `if self.use_parallel_residual:`.
    sequential_residual {
        block: ("`use_parallel_residual` were False", MODELING, 231),
        model: ("`use_parallel_residual` were False", MODELING, 231),
        trace: ("`use_parallel_residual` were False", MODELING, 231),
        decode: ("`use_parallel_residual` were False", MODELING, 231),
    }

    // transformers' causal rule, `kv_idx <= q_idx` (under sdpa without padding, the kernel's
    // `is_causal`, which keeps the same diagonal).
    mask_one_diagonal_off {
        attention: ("a mask's diagonal", "transformers/masking_utils.py", 76),
        block: ("a mask's diagonal", "transformers/masking_utils.py", 76),
        model: ("a mask's diagonal", "transformers/masking_utils.py", 76),
        trace: ("a mask's diagonal", "transformers/masking_utils.py", 76),
        decode: ("a mask's diagonal", "transformers/masking_utils.py", 76),
    }

    // The attention kernel, called with the module's `scaling` (`head_size**-0.5`).
    scale_one_over_d {
        attention: ("F.scaled_dot_product_attention(scale=1/d)", SDPA, 193),
        block: ("F.scaled_dot_product_attention(scale=1/d)", SDPA, 193),
        model: ("F.scaled_dot_product_attention(scale=1/d)", SDPA, 193),
        trace: ("F.scaled_dot_product_attention(scale=1/d)", SDPA, 193),
        decode: ("F.scaled_dot_product_attention(scale=1/d)", SDPA, 193),
    }

    // GELUActivation (`hidden_act = "gelu"`), called from the MLP.
    gelu_tanh {
        mlp: ("`hidden_act` were 'gelu_pytorch_tanh'", MODELING, 42),
        block: ("`hidden_act` were 'gelu_pytorch_tanh'", MODELING, 42),
        model: ("`hidden_act` were 'gelu_pytorch_tanh'", MODELING, 42),
        trace: ("`hidden_act` were 'gelu_pytorch_tanh'", MODELING, 42),
        decode: ("`hidden_act` were 'gelu_pytorch_tanh'", MODELING, 42),
    }

    // The first LayerNorm of a layer, `self.input_layernorm(hidden_states)`.
    layer_norm_eps_1e6 {
        block: ("`layer_norm_eps` were 1e-6", MODELING, 232),
        model: ("`layer_norm_eps` were 1e-6", MODELING, 232),
        decode: ("`layer_norm_eps` were 1e-6", MODELING, 232),
    }

    // The rotary embedding's frequencies, `base ** (torch.arange(0, dim, 2) / dim)`.
    rope_theta_default {
        attention: ("`rope_parameters['rope_theta']` were 10000.0", MODELING, 79),
        block: ("`rope_parameters['rope_theta']` were 10000.0", MODELING, 79),
        model: ("`rope_parameters['rope_theta']` were 10000.0", MODELING, 79),
        trace: ("`rope_parameters['rope_theta']` were 10000.0", MODELING, 79),
        decode: ("`rope_parameters['rope_theta']` were 10000.0", MODELING, 79),
    }

    // The kernel's output transposed back before the heads are merged.
    heads_merged_untransposed {
        attention: ("Tensor.transpose(1, 2) dropped", SDPA, 206),
        block: ("Tensor.transpose(1, 2) dropped", SDPA, 206),
        model: ("Tensor.transpose(1, 2) dropped", SDPA, 206),
        trace: ("Tensor.transpose(1, 2) dropped", SDPA, 206),
        decode: ("Tensor.transpose(1, 2) dropped", SDPA, 206),
    }
}

/// Every (mistake, kind of check): caught or not, what golden names first, how long it took. The
/// issue's "before" table (`--ignored --nocapture`).
#[test]
#[ignore = "prints the table of every mistake and check"]
fn print_the_table() {
    let mut rows = Vec::new();
    for (name, o) in mistakes() {
        for kind in Kind::ALL {
            let (failure, took) = run(kind, name, o);
            let (caught, said) = match &failure {
                None => ("passed", String::new()),
                Some(f) => {
                    let msg = f.to_string();
                    println!("{name} ({kind:?}), {:.1} s:\n{msg}\n", took.as_secs_f64());
                    ("caught", first_cause(&msg))
                }
            };
            rows.push(format!(
                "| {name} | {kind:?} | {caught} | {:.1} s | {said} |",
                took.as_secs_f64()
            ));
        }
    }
    println!("| mistake | check | verdict | time | first likely cause or note |");
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}

// --- the right port ------------------------------------------------------------------------------

fn right(kind: Kind) {
    let (failure, took) = run(kind, "right", Neox::default());
    if let Some(f) = failure {
        panic!("the right port failed its {kind:?} check:\n{f}");
    }
    println!(
        "the right port passes its {kind:?} check ({:.1} s)",
        took.as_secs_f64()
    );
}

#[test]
fn the_right_attention_passes() {
    right(Kind::Attention);
}

#[test]
fn the_right_mlp_passes() {
    right(Kind::Mlp);
}

#[test]
fn the_right_block_passes() {
    right(Kind::Block);
}

#[test]
fn the_right_causal_lm_passes() {
    right(Kind::Model);
}

#[test]
fn the_right_causal_lm_passes_its_trace() {
    right(Kind::Trace);
}

#[test]
fn the_right_causal_lm_passes_every_step_of_decode() {
    right(Kind::Decode);
}

/// The MLP and the block (the attention inside it); the attention on its own is below.
#[test]
fn the_right_port_passes_its_gradient_checks() {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    for (layer, port) in [
        (
            neox::mlp_layer("x_right_mlp_grad"),
            neox::mlp(Neox::default()),
        ),
        (
            neox::block_layer("x_right_block_grad"),
            neox::block(Neox::default()),
        ),
    ] {
        let layer = layer.grad(GradSpec::default());
        let scratch = common::Scratch::new(layer.name());
        let layer = common::declared_with_store(&layer, &scratch).mode(Mode::Live);
        if let Err(f) = golden::check_gradients(&layer, &move |i: &golden::PortInputs| port(i)) {
            panic!("the right port failed its gradient check:\n{f}");
        }
    }
}

// --- defects of golden found on the way, fixed --------------------------------------------------

/// It failed: on a case of one token and values ×100, PyTorch's float32 gradient of the
/// attention's fused projection is -0.11 at elements where its float64 gradient — and the port's —
/// is 0 (a softmax over one key has no gradient), and golden took the float64 disagreement for
/// "not the same computation" and dropped the rounding term (#31 item 15: one rule for the
/// elements where rounding decides).
#[test]
fn the_right_attention_passes_its_gradient_check() {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let layer = neox::attention_layer("x_right_attention_grad").grad(GradSpec::default());
    let scratch = common::Scratch::new(layer.name());
    let layer = common::declared_with_store(&layer, &scratch).mode(Mode::Live);
    let port = neox::attention(Neox::default());
    if let Err(f) = golden::check_gradients(&layer, &move |i: &golden::PortInputs| port(i)) {
        panic!("the right attention failed its gradient check:\n{f}");
    }
}

/// It failed: the training check called a submodule without the inputs its model builds for it
/// (the forward and gradient checks give `GPTNeoXLayer` its `position_embeddings` and mask), and
/// the reference raised `TypeError: cannot unpack non-iterable NoneType object` on every case. The
/// training is now driven as the forward is (`golden_ref/training.py`).
#[test]
fn the_right_block_trains_like_its_reference() {
    std::env::set_var("GOLDEN_VARIANTS", "off");
    let layer = neox::block_layer("x_right_block_overfit").overfit(golden::OverfitSpec::default());
    let scratch = common::Scratch::new(layer.name());
    let layer = common::declared_with_store(&layer, &scratch).mode(Mode::Live);
    let port = neox::block(Neox::default());
    if let Err(f) = golden::check_overfit(&layer, &move |i: &golden::PortInputs| port(i)) {
        panic!("the right block failed its training check:\n{f}");
    }
}

/// What the diagnosis costs on a failing whole model and a failing decode schedule of this tiny
/// GPT-NeoX (the parallel residual computed in sequence): the same failing check without and with
/// the mutation diagnosis, median of 3 each with a warm worker; the difference is the diagnosis.
/// Printed, not asserted: `cargo xtask bench-mutations`.
#[test]
#[ignore = "a benchmark: cargo xtask bench-mutations"]
fn diagnosis_cost() {
    let o = mistake("sequential_residual");
    for kind in [Kind::Model, Kind::Decode] {
        let mut cause = String::new();
        let mut time = |setting: &str| {
            std::env::set_var("GOLDEN_MUTATIONS", setting);
            let (failure, took) = run(kind, "sequential_residual_cost", o);
            let msg = failure.expect("the wrong port fails").to_string();
            cause = first_cause(&msg);
            took.as_secs_f64()
        };
        time("off"); // a warm worker, torch and transformers imported
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            off.push(time("off"));
            on.push(time("auto"));
        }
        std::env::remove_var("GOLDEN_MUTATIONS");
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (off, on) = (median(off), median(on));
        eprintln!(
            "a failing {kind:?} check of a 2-layer GPT-NeoX: {off:.2} s without the mutation \
             diagnosis, {on:.2} s with it: the diagnosis costs {:.2} s\n  {cause}",
            on - off
        );
    }
}

/// The LayerNorms' eps of 1e-6 for 1e-5 in the traced model: caught at a trace point only (with
/// weights drawn at unit gain the LayerNorms' inputs are of order one, where the two eps differ by
/// about 1e-5 of the output: just over the tolerance at one point of layer 0, while the logits
/// agree), so no mutation of the reference is searched: the trace says where.
#[test]
fn layer_norm_eps_1e6_is_caught_by_the_trace() {
    let msg = caught(
        Kind::Trace,
        "layer_norm_eps_1e6",
        mistake("layer_norm_eps_1e6"),
    );
    assert!(msg.contains("leaves its reference"), "{msg}");
}
