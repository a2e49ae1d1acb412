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
            .filter(|n| n.ends_with(".npy"))
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
    // Their order also as a manifest, which `golden diff` reads.
    let order = std::fs::read_to_string(format!("{dir}/trace/reference/order.txt")).unwrap();
    assert_eq!(order.lines().count(), 39);
    assert_eq!(order.lines().nth(21), Some("021_blocks.2.attn.proj"));

    // `golden diff` on the two dump folders finds the same first divergence.
    let trace = std::path::Path::new(dir).join("trace");
    let diff = golden_cli::diff::run(
        &trace.join("reference"),
        &trace.join("port"),
        golden_cli::diff::Tolerance::default(),
        &golden_cli::read::ReadOptions::default(),
    )
    .unwrap();
    let (at, row) = diff.first_divergence().expect("a known first divergence");
    assert_eq!(row.name, "021_blocks.2.attn.proj");
    assert_eq!(at, 21, "{}", diff.text());
    assert!(
        matches!(&diff.order, golden_cli::diff::Order::Manifest(p) if p.ends_with("reference/order.txt")),
        "{:?}",
        diff.order
    );
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
    // Refused, with the name it probably meant; not reported as a divergence.
    assert!(
        msg.starts_with(
            "golden: `t_tiny_lm_typo` taps a point its reference `zoo_ref.TinyLM` does not have"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the port taps `blocks.0.atn` [1, 1, 32], which is not a trace point of the \
             reference; did you mean `blocks.0.attn`?"
        ),
        "{msg}"
    );
}

// --- Hugging Face's LlamaDecoderLayer (transformers' own code) against a candle port -----------

use common::llama;

#[test]
fn a_faithful_llama_decoder_layer_matches_at_every_point_and_at_the_references_own_taps() {
    let port = llama::Port {
        tap_rotary: true,
        ..llama::Port::default()
    };
    let report = common::must_pass(&llama::decoder_layer("t_llama_decoder"), move |i| {
        llama::decoder(i.var_builder(), i.tensor(0), port)
    });
    let leaves: Vec<&str> = report.runs[0].cases[0]
        .leaves
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    // The reference's own taps (`golden_ref.tap` around transformers' apply_rotary_pos_emb) are
    // compared with the port's taps of the same names, in execution order among the submodules.
    assert_eq!(
        leaves,
        [
            "out",
            "trace.layer.input_layernorm",
            "trace.layer.self_attn.q_proj",
            "trace.layer.self_attn.k_proj",
            "trace.layer.self_attn.v_proj",
            "trace.q_rot",
            "trace.k_rot",
            "trace.layer.self_attn.o_proj",
            "trace.layer.self_attn.0",
            "trace.layer.post_attention_layernorm",
            "trace.layer.mlp.gate_proj",
            "trace.layer.mlp.up_proj",
            "trace.layer.mlp.down_proj",
            "trace.layer.mlp",
            "trace.layer",
        ]
    );
}

#[test]
fn a_tap_of_a_module_that_returns_a_tuple_is_refused_with_the_points_it_has() {
    // LlamaAttention returns (output, attention weights): its points are `self_attn.0` and
    // `self_attn.1`, and a tap of `self_attn` names neither.
    let port = llama::Port {
        tap_attention_as_module: true,
        ..llama::Port::default()
    };
    let f = common::must_fail(&llama::decoder_layer("t_llama_tuple_tap"), move |i| {
        llama::decoder(i.var_builder(), i.tensor(0), port)
    });
    let msg = f.to_string();
    let headline = msg.lines().next().unwrap();
    assert!(
        headline.starts_with(
            "golden: `t_llama_tuple_tap` taps a point its reference `llama_ref.DecoderLayer` does \
             not have"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the port taps `layer.self_attn` [1, 1, 16], which is not a trace point of the \
             reference; under it the reference has `layer.self_attn.0` [1, 1, 16], \
             `layer.self_attn.1` [1, 4, 1, 1]: a module that returns a tuple or a list is a point \
             per tensor (Hugging Face's attention returns its output and its attention \
             weights). Tap one of them: `layer.self_attn.0` has your tap's shape"
        ),
        "{msg}"
    );
    // Not a divergence: every point the port tapped under the reference's names matched.
    assert!(!msg.contains("leaves its reference"), "{msg}");
    assert!(!msg.contains("first divergence"), "{msg}");
}

#[test]
fn a_rotary_bug_is_found_at_the_references_own_tap_after_the_rotation() {
    // Rotating interleaved pairs where Llama rotates halves: the projections before it match, the
    // first point that differs is `q_rot`, which no submodule returns (the reference taps it).
    let port = llama::Port {
        tap_rotary: true,
        rope_on_pairs: true,
        ..llama::Port::default()
    };
    let f = common::must_fail(&llama::decoder_layer("t_llama_rope_pairs"), move |i| {
        llama::decoder(i.var_builder(), i.tensor(0), port)
    });
    let msg = f.to_string();
    let headline = msg.lines().next().unwrap();
    assert!(
        headline.starts_with(
            "golden: `t_llama_rope_pairs` leaves its reference `llama_ref.DecoderLayer` at `q_rot` \
             (trace point 5 of 14 tapped)"
        ),
        "{msg}"
    );
    let table = &msg[msg.find("the trace, in the reference's").expect(&msg)..];
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{table}"))
            .trim_end()
            .to_string()
    };
    assert!(line("layer.self_attn.v_proj").ends_with("ok"), "{table}");
    assert!(
        line("q_rot").ends_with("DIFFERS  <- first divergence"),
        "{table}"
    );
    assert!(line("k_rot").ends_with("differs"), "{table}");
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

// --- Dtypes along the trace ------------------------------------------------------------------------

/// The decoder layer checked in bf16, the port tapping the MLP's activation too.
fn bf16_decoder(name: &str) -> golden::Layer {
    llama::decoder_layer(name).dtypes(&[candle_core::DType::BF16])
}

#[test]
fn an_activation_leaking_f32_into_a_bf16_layer_is_found_where_it_leaks() {
    // The port's SiLU runs in float32 and its result goes on in float32 through the down
    // projection; cast back at the residual, the layer's output is as close to the reference as
    // bf16 allows, so values alone pass. Each point's dtype is compared with the reference's.
    let leaking = llama::Port {
        tap_activation: true,
        activation_leaks_f32: true,
        ..llama::Port::default()
    };
    let f = common::must_fail(&bf16_decoder("t_llama_bf16_f32_activation"), move |i| {
        llama::decoder(i.var_builder(), i.tensor(0), leaking)
    });
    let msg = f.to_string();
    println!("{msg}");
    assert!(
        msg.contains("leaves its reference `llama_ref.DecoderLayer` at `layer.mlp.act_fn`"),
        "{msg}"
    );
    assert!(
        msg.contains("trace point `layer.mlp.act_fn`: the port computes it in f32 [")
            && msg.contains("], the reference in bf16 ["),
        "{msg}"
    );
    assert!(
        msg.contains("f32≠bf16  DIFFERS  <- first divergence"),
        "{msg}"
    );
    // The right port, tapping the same points, passes: a float32 softmax inside the bf16 layer
    // (as the reference computes it) is no tap, and every tap is in the reference's dtype.
    let right = llama::Port {
        tap_activation: true,
        ..llama::Port::default()
    };
    common::must_pass(&bf16_decoder("t_llama_bf16_right"), move |i| {
        llama::decoder(i.var_builder(), i.tensor(0), right)
    });
}

/// `reach_ref.ScoresBlock` in bf16: its softmax point is float32 (as the reference computes it),
/// its argmax int64; `softmax_in_bf16` computes the port's softmax in bf16.
fn scores_port(
    i: &golden::PortInputs,
    softmax_in_bf16: bool,
) -> candle_core::Result<candle_core::Tensor> {
    use candle_core::{DType, D};
    let x = i.tensor(0);
    let w = i.var_builder().get((8, 8), "proj.weight")?;
    let scores = x.broadcast_matmul(&w.t()?)?;
    golden::tap("proj", &scores);
    let probs = if softmax_in_bf16 {
        candle_nn::ops::softmax(&scores, D::Minus1)?
    } else {
        candle_nn::ops::softmax(&scores.to_dtype(DType::F32)?, D::Minus1)?
    };
    golden::tap("softmax", &probs);
    // candle's argmax gives u32 where torch gives int64: the same integers, no dtype issue.
    golden::tap("pick", &probs.argmax(D::Minus1)?);
    probs.to_dtype(x.dtype())
}

fn scores_layer(name: &str) -> golden::Layer {
    golden::Layer::module(name, "reach_ref.ScoresBlock")
        .init("d", 8usize)
        .dim("b", 1, 3)
        .arg(
            "x",
            ["b".into(), golden::DimExpr::Lit(8)],
            golden::Dist::default(),
        )
        .dtypes(&[candle_core::DType::BF16])
        .cases(8)
        .trace()
}

#[test]
fn a_float32_softmax_inside_a_bf16_model_passes_where_the_reference_computes_one_too() {
    // The reference's softmax point is float32: the port's float32 softmax matches it (golden
    // once cast every tap to the case dtype, and refused this as a dtype mismatch), and candle's
    // u32 argmax matches torch's int64.
    common::must_pass(&scores_layer("t_scores_f32_softmax"), |i| {
        scores_port(i, false)
    });
    let msg = common::must_fail(&scores_layer("t_scores_bf16_softmax"), |i| {
        scores_port(i, true)
    })
    .to_string();
    assert!(
        msg.contains("trace point `softmax`: the port computes it in bf16 [")
            && msg.contains("], the reference in f32 ["),
        "{msg}"
    );
}
