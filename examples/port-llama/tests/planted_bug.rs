//! A planted bug: the model's rotary embedding applied to interleaved pairs (candle's `rope_i`,
//! GPT-J's layout) instead of Llama's halves (`rope`, Hugging Face's `rotate_half`). The check
//! must fail, say where the model first leaves its reference, and — where the reference runs —
//! name the cause: golden's mutation diagnosis re-runs `LlamaModel` with `rotate_half` on
//! interleaved pairs and finds that the port matches it.

use golden::{Dist, IntoOutputs, Layer, PortInputs, Value};
use port_llama::model::{llama_model_with, Sizes};

/// The layer `llama_model`'s attribute describes, in its first configuration (head size 8, no
/// biases) and in float32 (golden's `Layer`, written out).
fn layer() -> Layer {
    let times = |k: i64| {
        Value::Dims(golden::DimValue::Mul(
            Box::new(golden::DimValue::Lit(k)),
            Box::new(golden::DimValue::dim("kv")),
        ))
    };
    Layer::module("llama_model_interleaved", "transformers.LlamaModel")
        .config("transformers.LlamaConfig")
        .config_value("vocab_size", 64)
        .config_value("hidden_size", times(16))
        .config_value("intermediate_size", 48)
        .config_value("num_hidden_layers", 1)
        .config_value("num_attention_heads", times(2))
        .config_value("num_key_value_heads", Value::dim("kv"))
        .config_value("head_dim", 8)
        .config_value("max_position_embeddings", 64)
        .config_value("use_cache", false)
        .dim("b", 1, 2)
        .dim("t", 1, 8)
        .dim("kv", 1, 2)
        .arg("input_ids", ["b", "t"], Dist::int(0, 64))
        .trace()
        .cases(16)
        .declared_at(golden::declared!())
}

fn interleaved(i: &PortInputs) -> Result<golden::Outputs, String> {
    let kv = i.dim("kv");
    let sizes = Sizes {
        vocab: 64,
        hidden: 16 * kv,
        intermediate: 48,
        heads: 2 * kv,
        kv_heads: kv,
        head_dim: 8,
        attention_bias: false,
    };
    llama_model_with(
        i.var_builder(),
        i.tensor(0),
        &sizes,
        candle_nn::rotary_emb::rope_i,
    )
    .map(|out| std::collections::BTreeMap::from([("last_hidden_state", out)]))
    .into_outputs()
}

#[test]
fn interleaved_rope_fails_and_is_named() {
    let failure = golden::check(&layer(), &interleaved).expect_err("the planted bug must fail");
    let msg = failure.to_string();
    // RoPE changes nothing at position 0: the smallest failing case has two positions, and the
    // trace's first divergence is in the decoder layer, after the projections (which agree).
    assert!(
        msg.contains("golden: `llama_model_interleaved` leaves its reference `transformers.LlamaModel` at `layers.0."),
        "{msg}"
    );
    assert!(msg.contains("dims b=1 t=2"), "{msg}");
    assert!(
        msg.contains("3 layers.0.self_attn.q_proj") && msg.contains("ok"),
        "{msg}"
    );
    if msg.contains("the mutation diagnosis was skipped") {
        // A replay on a machine without torch: the numbers alone fail it.
        return;
    }
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with rotary embeddings on interleaved \
             pairs (x0,x1),(x2,x3)… (rope_i) at transformers/models/llama/modeling_llama.py:123 \
             (instead of the two halves (rotate_half))"
        ),
        "the mutation diagnosis names the rotation and its line: {msg}"
    );
    assert!(
        msg.contains(
            "fix: rotate the two halves as the reference does: candle_nn::rotary_emb::rope"
        ),
        "{msg}"
    );
}
