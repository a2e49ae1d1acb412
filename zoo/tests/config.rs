//! Modules built from a configuration class (`config = "transformers.LlamaConfig"(...)`) with
//! values that depend on the case's dims: the module's shapes change per case, so its parameter
//! list is asked (and stored) per construction; and what a golden store was recorded with (the
//! versions of transformers and the rest, the reference's source) is compared on replay.

mod common;

use candle_core::{Module, Tensor};
use common::Scratch;
use golden::internal::answers::store::{self, Store};
use golden::internal::describe::env::Mode;
use golden::{DimValue, Dist, IntoOutputs, Layer, PortInputs, Value};

fn times(k: i64, dim: &str) -> DimValue {
    DimValue::Mul(Box::new(DimValue::Lit(k)), Box::new(DimValue::dim(dim)))
}

/// Hugging Face's LlamaMLP, built from a LlamaConfig whose hidden size is `2 * h` (LlamaConfig
/// wants an even head size, here one head) and its intermediate size `3 * h`.
fn llama_mlp(scratch: &Scratch) -> Layer {
    Layer::module(
        "llama_mlp",
        "transformers.models.llama.modeling_llama.LlamaMLP",
    )
    .config("transformers.LlamaConfig")
    .config_value("hidden_size", Value::Dims(times(2, "h")))
    .config_value("intermediate_size", Value::Dims(times(3, "h")))
    .config_value("hidden_act", "silu")
    .config_value("num_attention_heads", 1)
    .dim("b", 1, 2)
    .dim("t", 1, 3)
    .dim("h", 1, 4)
    .arg(
        "x",
        [golden::DimExpr::from("b"), "t".into(), times(2, "h").into()],
        Dist::default(),
    )
    .cases(12)
    .declared_at(scratch.declared)
}

/// The SwiGLU MLP in candle; its sizes come from the case (`PortInputs::dim`), as the attribute
/// passes `hidden_size = 2 * h` to a same-named parameter. `swapped` swaps the up and gate
/// projections: SwiGLU's usual mistake.
fn swiglu_port(i: &PortInputs, swapped: bool) -> Result<golden::Outputs, String> {
    let (d, inter) = (2 * i.dim("h"), 3 * i.dim("h"));
    let vb = i.var_builder();
    let run = || -> candle_core::Result<Tensor> {
        let mut gate = candle_nn::linear_no_bias(d, inter, vb.pp("gate_proj"))?;
        let mut up = candle_nn::linear_no_bias(d, inter, vb.pp("up_proj"))?;
        if swapped {
            std::mem::swap(&mut gate, &mut up);
        }
        let down = candle_nn::linear_no_bias(inter, d, vb.pp("down_proj"))?;
        let x = i.tensor(0);
        down.forward(&(gate.forward(x)?.silu()? * up.forward(x)?)?)
    };
    run().into_outputs()
}

fn swiglu(i: &PortInputs) -> Result<golden::Outputs, String> {
    swiglu_port(i, false)
}

#[test]
fn a_config_class_with_dims_builds_each_case_s_module_and_replays() {
    let scratch = Scratch::new("config_dims");
    let recorded = golden::check(&llama_mlp(&scratch).mode(Mode::Record), &swiglu)
        .unwrap_or_else(|f| panic!("{f}"));
    let snapshot = recorded.snapshot().unwrap();
    // The description keeps the values as written.
    assert!(
        snapshot.contains(
            "config: transformers.LlamaConfig(hidden_size = 2 * h, intermediate_size = 3 * h, \
             hidden_act = \"silu\", num_attention_heads = 1)"
        ),
        "{snapshot}"
    );
    // One parameter list per distinct construction: the cases drew several `d`.
    let stored = Store::load(&scratch.store(&llama_mlp(&scratch)))
        .unwrap()
        .unwrap();
    let keys: Vec<&str> = stored
        .params
        .iter()
        .map(|(k, _)| k.as_deref().expect("keyed by construction"))
        .collect();
    assert!(keys.len() > 1, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.contains("\"hidden_size\":")),
        "{keys:?}"
    );
    assert!(snapshot.contains("x [b, t, 2 * h]"), "{snapshot}");
    for (key, spec) in &stored.params {
        let d: usize = key
            .as_deref()
            .unwrap()
            .split("\"hidden_size\":")
            .nth(1)
            .unwrap()[..1]
            .parse()
            .unwrap();
        let gate = spec
            .entries
            .iter()
            .find(|e| e.name == "gate_proj.weight")
            .unwrap();
        assert_eq!(gate.shape, vec![3 * d / 2, d], "{key:?}");
    }
    // The provenance: torch, transformers and the file that defines LlamaMLP.
    let provenance = stored.provenance.as_ref().expect("format 3 records it");
    let names: Vec<&str> = provenance
        .packages
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        names.contains(&"torch") && names.contains(&"transformers"),
        "{names:?}"
    );
    assert!(
        provenance
            .sources
            .iter()
            .any(|(f, _)| f == "transformers/models/llama/modeling_llama.py"),
        "{:?}",
        provenance.sources
    );
    let replayed = golden::check(&llama_mlp(&scratch).mode(Mode::Replay), &swiglu)
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(replayed.snapshot(), recorded.snapshot());
}

#[test]
fn a_wrong_port_of_a_configured_module_fails_with_the_case_s_sizes() {
    let scratch = Scratch::new("config_wrong");
    // Up and gate swapped: SwiGLU's usual mistake.
    let swapped = |i: &PortInputs| swiglu_port(i, true);
    let failure = golden::check(&llama_mlp(&scratch).mode(Mode::Live), &swapped)
        .expect_err("the swapped port fails");
    let msg = failure.to_string();
    assert!(
        msg.contains(
            "does not match its reference `transformers.models.llama.modeling_llama.LlamaMLP`"
        ),
        "{msg}"
    );
    // The artifacts' case.json has the config as this case built it.
    let dir = msg.lines().last().unwrap().trim();
    let case: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{dir}/case.json")).unwrap()).unwrap();
    let h = failure.case.as_ref().unwrap().dim("h").unwrap();
    assert_eq!(case["config"]["values"]["hidden_size"], 2 * h);
    assert_eq!(case["config"]["values"]["intermediate_size"], 3 * h);
}

#[test]
fn a_replay_of_a_store_from_another_transformers_says_so_without_changing_the_snapshot() {
    let scratch = Scratch::new("config_stale");
    let recorded = golden::check(&llama_mlp(&scratch).mode(Mode::Record), &swiglu)
        .unwrap_or_else(|f| panic!("{f}"));
    let path = scratch.store(&llama_mlp(&scratch));
    let stored = Store::load(&path).unwrap().unwrap();
    let mut provenance = stored.provenance.clone().unwrap();
    let now = provenance
        .packages
        .iter()
        .find(|(n, _)| n == "transformers")
        .unwrap()
        .1
        .clone();
    for (name, version) in &mut provenance.packages {
        if name == "transformers" {
            *version = "4.0.0".into();
        }
    }
    store::save(
        &path,
        &stored.description,
        &stored.params,
        Some(&provenance),
        stored.entries(),
        usize::MAX,
        0,
    )
    .unwrap();
    // Passing: the snapshot is what it was, but for its store lines: the store was re-sealed, and
    // says it was recorded with transformers 4.0.0 (what a pull request's diff then shows).
    let replayed = golden::check(&llama_mlp(&scratch).mode(Mode::Replay), &swiglu)
        .unwrap_or_else(|f| panic!("{f}"));
    let storeless = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("golden store: "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (replayed, recorded) = (replayed.snapshot().unwrap(), recorded.snapshot().unwrap());
    assert_eq!(storeless(&replayed), storeless(&recorded));
    let recorded_with = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("golden store: recorded with "))
            .unwrap_or_else(|| panic!("no provenance line in:\n{s}"))
            .to_string()
    };
    assert!(
        recorded_with(&recorded).contains(&format!("transformers {now}")),
        "{recorded}"
    );
    assert!(
        recorded_with(&replayed).contains("transformers 4.0.0"),
        "{replayed}"
    );
    // Failing: the message says the evidence is stale, and how to refresh it.
    let zeros = |i: &PortInputs| i.tensor(0).zeros_like().into_outputs();
    let msg = golden::check(&llama_mlp(&scratch).mode(Mode::Replay), &zeros)
        .expect_err("zeros fail")
        .to_string();
    assert!(
        msg.contains(&format!(
            "warning: the golden store {} was recorded with transformers 4.0.0 (now {now}): its \
             answers may not be what the reference gives now; record it (needs Python with \
             torch): GOLDEN_MODE=record cargo test",
            path.display()
        )),
        "{msg}"
    );
}

#[test]
fn a_reference_edited_since_its_store_was_recorded_is_named() {
    let scratch = Scratch::new("edited_ref");
    let package = scratch.dir.join("reference_py").join("edited_ref");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("__init__.py"), "").unwrap();
    std::fs::write(package.join("ops.py"), "def double(x):\n    return 2 * x\n").unwrap();
    let declared = golden::Declared {
        manifest_dir: Box::leak(scratch.dir.display().to_string().into_boxed_str()),
        ..scratch.declared
    };
    let layer = |mode| {
        Layer::function("double", "edited_ref.ops.double")
            .dim("n", 1, 8)
            .arg("x", ["n"], Dist::default())
            .cases(4)
            .declared_at(declared)
            .mode(mode)
    };
    let right = |i: &PortInputs| (i.tensor(0) * 2.0).into_outputs();
    golden::check(&layer(Mode::Record), &right).unwrap_or_else(|f| panic!("{f}"));
    let stored =
        Store::load(&golden::internal::answers::store::path(&layer(Mode::Replay), "").unwrap())
            .unwrap()
            .unwrap();
    assert!(
        stored
            .provenance
            .as_ref()
            .unwrap()
            .sources
            .iter()
            .any(|(f, _)| f == "edited_ref/ops.py"),
        "{:?}",
        stored.provenance
    );
    // An unchanged reference replays without a word about it.
    let wrong = |i: &PortInputs| (i.tensor(0) * 3.0).into_outputs();
    let msg = golden::check(&layer(Mode::Replay), &wrong)
        .expect_err("wrong")
        .to_string();
    assert!(!msg.contains("warning: the golden store"), "{msg}");
    std::fs::write(package.join("ops.py"), "def double(x):\n    return x + x\n").unwrap();
    let msg = golden::check(&layer(Mode::Replay), &wrong)
        .expect_err("wrong")
        .to_string();
    assert!(
        msg.contains("was recorded with another edited_ref/ops.py (it changed since)"),
        "{msg}"
    );
}
