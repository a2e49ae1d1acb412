//! Helpers shared by the framework's integration tests.
#![allow(dead_code)]

pub mod decoder;
pub mod gpt2;
pub mod held_out;
pub mod held_out_ports;
pub mod llama;
pub mod mutation_ports;
pub mod neox_ports;
pub mod overfit_mlp;
pub mod porter_ports;
pub mod processes;
pub mod rotary;
pub mod sweep_ports;
pub mod tiny_llama;
pub mod tiny_lm;
pub mod unseen_ports;
pub mod variant_ports;

use std::path::PathBuf;

/// A throwaway crate layout in the temp folder (`src/lib.rs`, `src/check.rs`, `snapshots/`), so
/// that proptest's regression files and golden stores of a test never land in the repository.
pub struct Scratch {
    pub dir: PathBuf,
    pub declared: golden::Declared,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("golden-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("src/lib.rs"), "").unwrap();
        std::fs::write(dir.join("src/check.rs"), "").unwrap();
        let leak =
            |p: PathBuf| -> &'static str { Box::leak(p.display().to_string().into_boxed_str()) };
        let declared = golden::Declared {
            source_file: leak(dir.join("src/check.rs")),
            module_path: leak(PathBuf::from(format!("scratch::{name}"))),
            snapshot_dir: leak(dir.join("snapshots")),
            ..golden::declared!()
        };
        Scratch { dir, declared }
    }

    /// The golden store of a check named `layer` declared here.
    pub fn store(&self, layer: &golden::Layer) -> PathBuf {
        golden::internal::answers::store::path(layer, "").expect("declared")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A checking function of the runtime: `golden::check` (forward), `golden::gradients::check`, ...
pub type CheckFn = fn(&golden::Layer, &golden::Port<'_>) -> Result<golden::Report, golden::Failure>;

/// Run a check of a deliberately wrong port that must fail; returns the failure. The check is
/// declared with its golden store in `tests/golden/<layer name>.golden` (layer names are unique
/// across the wrong-port suites) and its regression file in a scratch folder.
pub fn must_fail(
    layer: &golden::Layer,
    port: impl Fn(&golden::PortInputs) -> candle_core::Result<candle_core::Tensor>
        + Clone
        + Send
        + Sync
        + 'static,
) -> golden::Failure {
    must_fail_check(golden::check, layer, port)
}

/// `layer` declared with its golden store in `tests/golden/<layer name>.golden` and its regression
/// file in `scratch`.
pub fn declared_with_store(layer: &golden::Layer, scratch: &Scratch) -> golden::Layer {
    layer.clone().declared_at(golden::Declared {
        // The test target (`gradients` in tests/gradients.rs): re-run commands name it.
        module_path: module_path!().split("::").next().unwrap(),
        snapshot_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"),
        ..scratch.declared
    })
}

/// Run a check of a right port that must pass, declared like [`must_fail`]'s; returns its report.
pub fn must_pass_check(
    check: CheckFn,
    layer: &golden::Layer,
    port: impl Fn(&golden::PortInputs) -> candle_core::Result<candle_core::Tensor>
        + Clone
        + Send
        + Sync
        + 'static,
) -> golden::Report {
    use golden::IntoOutputs;
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    let port = move |inputs: &golden::PortInputs| port(inputs).into_outputs();
    check(&layer, &port)
        .unwrap_or_else(|f| panic!("the right port `{}` failed:\n{f}", layer.name()))
}

/// [`must_pass_check`] for the forward check.
pub fn must_pass(
    layer: &golden::Layer,
    port: impl Fn(&golden::PortInputs) -> candle_core::Result<candle_core::Tensor>
        + Clone
        + Send
        + Sync
        + 'static,
) -> golden::Report {
    must_pass_check(golden::check, layer, port)
}

/// [`must_fail`] for any kind of check.
pub fn must_fail_check(
    check: CheckFn,
    layer: &golden::Layer,
    port: impl Fn(&golden::PortInputs) -> candle_core::Result<candle_core::Tensor>
        + Clone
        + Send
        + Sync
        + 'static,
) -> golden::Failure {
    use golden::IntoOutputs;
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    let port = move |inputs: &golden::PortInputs| port(inputs).into_outputs();
    match check(&layer, &port) {
        Ok(_) => panic!("the wrong port `{}` passed its check", layer.name()),
        Err(failure) => failure,
    }
}

/// The port of a check with `decode`: `make` builds the model from the module's weights (once per
/// case), `step` runs one step of it; the step's output is the model's `leaf` (`out.<leaf>`).
pub fn stepping<M: 'static>(
    leaf: &'static str,
    make: impl Fn(candle_nn::VarBuilder<'static>) -> candle_core::Result<M>
        + Clone
        + Send
        + Sync
        + 'static,
    step: fn(&mut M, &golden::Step) -> candle_core::Result<candle_core::Tensor>,
) -> impl Fn(&golden::PortInputs) -> Result<golden::Outputs, String> + Clone + Send + Sync + 'static
{
    move |inputs: &golden::PortInputs| {
        let make = make.clone();
        golden::drive(inputs, move |inputs| {
            let made = make(inputs.var_builder()).map(|mut model| {
                move |s: &golden::Step| -> candle_core::Result<
                    std::collections::BTreeMap<&'static str, candle_core::Tensor>,
                > { Ok([(leaf, step(&mut model, s)?)].into()) }
            });
            golden::IntoStepper::into_stepper(made)
        })
    }
}

/// A causal mask of `t` positions to add to attention scores: 0 where a query may see the key
/// (at or before it), -inf after.
pub fn causal_mask(
    t: usize,
    device: &candle_core::Device,
) -> candle_core::Result<candle_core::Tensor> {
    let mask: Vec<f32> = (0..t)
        .flat_map(|r| (0..t).map(move |c| if c <= r { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    candle_core::Tensor::from_vec(mask, (t, t), device)
}

/// Asserts that a failure names the cause a user needs (issue #30, "say why, not only where"): a
/// line of `msg` starting `likely cause:` that [`says`] `words` at `site`.
#[track_caller]
pub fn assert_named(msg: &str, words: &str, site: &str) {
    let named = msg
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("likely cause:"))
        .any(|l| says(l, words, site));
    assert!(
        named,
        "no `likely cause:` line says `{words}` at `{site}`:\n{msg}"
    );
}

/// Whether a line of a failure contains `words` and the reference's `site`, a `file.py:line` —
/// written in full, or as `:line` after the same file earlier in the line (golden lists several
/// sites of one file as `modeling_x.py:12, :14`). An empty `site` is a cause with no line of the
/// reference (a mistake in how the port is driven through time): any line with the words.
pub fn says(line: &str, words: &str, site: &str) -> bool {
    if !line.contains(words) {
        return false;
    }
    if site.is_empty() {
        return true;
    }
    let (file, number) = site
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("a site is `file.py:line`, not `{site}`"));
    let Some(start) = line.find(file) else {
        return false;
    };
    let rest = &line[start..];
    let needle = format!(":{number}");
    rest.match_indices(&needle)
        .any(|(i, _)| !rest[i + needle.len()..].starts_with(|c: char| c.is_ascii_digit()))
}
