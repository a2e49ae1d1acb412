//! Checks through time: ports that keep a KV cache, driven through generated schedules (a prefill
//! and decode steps, chunked prefills, padded batches, sliding windows, generation) against
//! transformers' own cached models. Right ports pass; each wrong port fails at the step where its
//! bug first shows, with a message that names it.
//!
//! Each check has a golden store in `tests/golden/` (`GOLDEN_MODE=record cargo test --test
//! schedules`), so the assertions hold in replay too.

// A `Failure` carries the whole failing case; these helpers return it as the checks do.
#![allow(clippy::result_large_err)]

mod common;

use candle_core::Tensor;
use common::decoder::{self, Bugs};
use common::gpt2;
use common::{declared_with_store, Scratch};
use golden::{Decode, DimExpr, DimValue, Failure, Layer, Report};

fn run(layer: &Layer, window: Option<usize>, bugs: Bugs) -> Result<Report, Failure> {
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    golden::check(&layer, &decoder::port(window, bugs))
}

fn must_fail(layer: &Layer, window: Option<usize>, bugs: Bugs) -> String {
    match run(layer, window, bugs) {
        Ok(_) => panic!("the wrong port `{}` passed", layer.name()),
        Err(f) => {
            let msg = f.to_string();
            println!("{msg}");
            msg
        }
    }
}

fn must_pass(layer: &Layer, window: Option<usize>) -> Report {
    run(layer, window, Bugs::default())
        .unwrap_or_else(|f| panic!("the right port `{}` failed:\n{f}", layer.name()))
}

fn llama(name: &str) -> Layer {
    decoder::causal_lm(name, "transformers.LlamaForCausalLM", None)
}

fn mistral(name: &str, window: usize) -> Layer {
    decoder::causal_lm(name, "transformers.MistralForCausalLM", Some(window))
}

fn padded(layer: Layer) -> Layer {
    layer.decode(Decode {
        padding: true,
        ..Decode::over("input_ids")
    })
}

fn generating(layer: Layer, tokens: usize) -> Layer {
    let decode = layer.decoding().unwrap().clone();
    layer.decode(Decode {
        generate: tokens,
        ..decode
    })
}

#[test]
fn a_cached_llama_port_passes_every_step() {
    let report = must_pass(&llama("s_llama_right"), None);
    let snapshot = report.snapshot().expect("the declared cases ran");
    println!("{snapshot}");
    // The snapshot says which schedules were covered and how close every step came, against the
    // cached run and against the one-shot forward.
    assert!(
        snapshot.contains("decode: over input_ids (axis 1)"),
        "{snapshot}"
    );
    assert!(snapshot.contains("  schedules: 12 cases; "), "{snapshot}");
    assert!(
        snapshot.contains("decoding after a prefill of"),
        "{snapshot}"
    );
    for against in ["cached run", "one-shot forward"] {
        assert!(
            snapshot.contains(&format!(
                "every step's out.logits, against the {against} (f32)"
            )),
            "{snapshot}"
        );
    }
}

#[test]
fn a_cached_llama_port_passes_in_bf16() {
    // Half precision through time: every step in bf16, judged as the forward check judges a
    // low-precision leaf (and as accurate as the reference against float64).
    let layer = llama("s_llama_bf16").dtypes(&[candle_core::DType::BF16]);
    must_pass(&layer, None);
}

#[test]
fn a_mistral_port_with_its_sliding_window_passes_every_step() {
    must_pass(&mistral("s_mistral_right", 3), Some(3));
}

#[test]
fn padded_batches_and_generation_pass_with_a_right_port() {
    must_pass(&generating(padded(llama("s_llama_padded_right")), 3), None);
}

#[test]
fn rotary_positions_not_offset_in_decode_fail_at_the_first_step_after_the_prefill() {
    let bugs = Bugs {
        rope_not_offset: true,
        ..Bugs::default()
    };
    let msg = must_fail(&llama("s_llama_rope_offset"), None, bugs);
    assert!(
        msg.contains(
            "leaves its reference `transformers.LlamaForCausalLM` at step 1, the decode step at \
             position 1 (after 1 cached)"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("steps 1+1,"),
        "shrunk to a prefill and one step: {msg}"
    );
    assert!(
        msg.contains(
            "likely cause: the port matches the reference with the schedule driven with position \
             ids that restart at 0 in every call"
        ),
        "{msg}"
    );
    assert!(msg.contains("on both failing cases"), "{msg}");
}

#[test]
fn a_cache_concatenated_on_the_wrong_axis_is_named_with_its_step() {
    let bugs = Bugs {
        cache_on_heads_axis: true,
        ..Bugs::default()
    };
    let msg = must_fail(&llama("s_llama_cache_axis"), None, bugs);
    // The step, the op and both shapes: the cache [1, 2·kv, 1, d] against the query's heads.
    assert!(
        msg.contains(
            "the port returned an error: at step 1, the decode step at position 1 (after 1 \
             cached): shape mismatch in matmul, lhs: [1, 4, 1, 4], rhs: [1, 8, 4, 1]"
        ),
        "{msg}"
    );
}

#[test]
fn a_square_mask_fails_in_a_chunked_prefill() {
    let bugs = Bugs {
        square_mask: true,
        ..Bugs::default()
    };
    let msg = must_fail(&llama("s_llama_square_mask"), None, bugs);
    // The smallest chunked prefill: one token cached, then two.
    assert!(msg.contains("steps 1+2,"), "{msg}");
    assert!(
        msg.contains(
            "at step 1, a chunk of 2 tokens at positions 1..=2 on a cache of 1: cannot broadcast \
             [1, 1, 2, 2] to [1, 4, 2, 3]"
        ),
        "{msg}"
    );
}

#[test]
fn a_sliding_window_one_key_wider_fails_once_crossed() {
    let bugs = Bugs {
        window_wider: true,
        ..Bugs::default()
    };
    let msg = must_fail(&mistral("s_mistral_window_wider", 3), Some(3), bugs);
    // Position 3 is the first that a window of 3 keys no longer reaches back to 0.
    assert!(msg.contains("n=4"), "shrunk to the window + 1: {msg}");
    assert!(
        msg.contains("leaves its reference `transformers.MistralForCausalLM` at step"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the schedule driven with a sliding window of 4 keys (instead of 3 keys: key j is seen \
             by query i when j > i − 3)"
        ),
        "{msg}"
    );
    assert!(msg.contains("fix: keep keys j with i − 3 < j ≤ i"), "{msg}");
}

fn run_gpt2(name: &str, bugs: Bugs) -> Result<Report, Failure> {
    let scratch = Scratch::new(name);
    let layer = declared_with_store(&gpt2::gpt2(name), &scratch);
    golden::check(&layer, &gpt2::port(bugs))
}

#[test]
fn a_gpt2_port_with_learned_positions_passes_padded_batches() {
    run_gpt2("s_gpt2_right", Bugs::default()).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn position_ids_that_ignore_left_padding_fail() {
    let bugs = Bugs {
        positions_ignore_padding: true,
        ..Bugs::default()
    };
    let msg = run_gpt2("s_gpt2_positions_padding", bugs)
        .expect_err("a wrong port")
        .to_string();
    println!("{msg}");
    assert!(
        msg.contains("padding left") || msg.contains("padding one-token"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the schedule driven with position ids `offset..offset + t` in every row, padding \
             counted"
        ),
        "{msg}"
    );
}

#[test]
fn padded_keys_that_are_not_masked_fail() {
    let bugs = Bugs {
        pad_keys_unmasked: true,
        ..Bugs::default()
    };
    let msg = must_fail(&padded(llama("s_llama_pad_keys")), None, bugs);
    // Whether the values show it on a case depends on its tokens (a pad token equal to the valid
    // one leaves the attention's average unchanged); the leakage check does not.
    assert!(
        msg.contains("padding leaks into valid outputs")
            || msg.contains("the schedule driven with no padding mask"),
        "{msg}"
    );
}

#[test]
fn a_schedule_longer_than_the_positions_is_refused_before_any_case() {
    let layer = generating(llama("s_llama_too_long").dim("n", 2, 64), 4);
    let port = decoder::port(None, Bugs::default());
    let msg = golden::check(&layer, &port)
        .expect_err("too long")
        .to_string();
    assert!(
        msg.contains(
            "the longest schedule reaches 68 positions (`n` up to 64, then 4 generated), beyond \
             the module's max_position_embeddings (64)"
        ),
        "{msg}"
    );
}

#[test]
fn a_port_stuck_at_a_step_is_abandoned_at_the_timeout_naming_the_step() {
    let layer = llama("s_llama_stuck").timeout(3.0);
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(&layer, &scratch);
    let port = |inputs: &golden::PortInputs| {
        golden::drive(inputs, |inputs| {
            let made = decoder::Model::new(inputs.var_builder(), None, Bugs::default()).map(
                |mut model| {
                    move |step: &golden::Step| {
                        if step.index() == 1 {
                            std::thread::sleep(std::time::Duration::from_secs(3600));
                        }
                        model.step(step)
                    }
                },
            );
            golden::IntoStepper::into_stepper(made)
        })
    };
    let started = std::time::Instant::now();
    let msg = golden::check(&layer, &port).expect_err("stuck").to_string();
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
    assert!(msg.contains("did not return within 3 s"), "{msg}");
    assert!(
        msg.contains("(at step 1, the decode step at position"),
        "{msg}"
    );
}

fn run_attention(layer: &Layer, bugs: Bugs) -> Result<Report, Failure> {
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(layer, &scratch);
    golden::check(&layer, &decoder::attention_port(bugs))
}

#[test]
fn a_submodule_gets_the_positions_and_mask_its_model_builds_in_a_single_forward() {
    // No schedule: one step over the whole input, against `LlamaAttention` given the rotary
    // embedding and causal mask `LlamaModel` would build for it — no wrapper.
    let layer = decoder::llama_attention("s_attention_single");
    run_attention(&layer, Bugs::default()).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_submodule_follows_a_schedule_with_its_cache() {
    let layer = decoder::llama_attention("s_attention_cached").decode(Decode {
        padding: true,
        ..Decode::over("x")
    });
    run_attention(&layer, Bugs::default()).unwrap_or_else(|f| panic!("{f}"));
    let wrong = layer.clone().named("s_attention_rope_offset");
    let bugs = Bugs {
        rope_not_offset: true,
        ..Bugs::default()
    };
    let msg = run_attention(&wrong, bugs)
        .expect_err("a wrong port")
        .to_string();
    println!("{msg}");
    assert!(
        msg.contains("leaves its reference `transformers.models.llama.modeling_llama.LlamaAttention` at step 1"),
        "{msg}"
    );
    assert!(
        msg.contains("the schedule driven with position ids that restart at 0 in every call"),
        "{msg}"
    );
}

/// `zoo_ref.samplers.ddpm_step` in candle: the timestep runs down, step k takes `noise[k]` (or, the
/// planted bug, `noise[t]`: the random numbers in the timesteps' order).
fn ddpm_step(i: &golden::PortInputs, noise_by_timestep: bool) -> candle_core::Result<Tensor> {
    const STEPS: usize = 8;
    let beta = |t: usize| 1e-4 + (0.02 - 1e-4) * t as f64 / (STEPS - 1) as f64;
    let alpha_bar = |t: usize| (0..=t).map(|s| 1.0 - beta(s)).product::<f64>();
    let (x, noise, weight) = (i.tensor(0), i.tensor(1), i.tensor(2));
    let count = noise.dim(0)?;
    let step = i.dim("step");
    let t = count - 1 - step;
    let eps = x.matmul(weight)?.tanh()?;
    let mean = ((x - (eps * (beta(t) / (1.0 - alpha_bar(t)).sqrt()))?)? / (1.0 - beta(t)).sqrt())?;
    if t == 0 {
        return Ok(mean);
    }
    let k = if noise_by_timestep { t } else { step };
    mean + (noise.get(k)? * beta(t).sqrt())?
}

fn sampler(name: &str) -> Layer {
    Layer::function(name, "zoo_ref.samplers.ddpm_step")
        .dim("k", 1, 8)
        .dim("b", 1, 2)
        .dim("d", 1, 8)
        .arg("x", ["b", "d"], golden::Dist::default())
        .arg("noise", ["k", "b", "d"], golden::Dist::default())
        .arg("weight", ["d", "d"], golden::Dist::normal(0.0, 0.5))
        .steps(golden::StepLoop {
            over: "k".into(),
            carry: vec![("x".into(), "out".into())],
        })
        .cases(16)
}

#[test]
fn a_sampler_is_driven_step_by_step_with_golden_s_random_numbers() {
    let scratch = Scratch::new("s_sampler_right");
    let layer = declared_with_store(&sampler("s_sampler_right"), &scratch);
    let report = golden::check(&layer, &|i: &golden::PortInputs| {
        golden::IntoOutputs::into_outputs(ddpm_step(i, false))
    })
    .unwrap_or_else(|f| panic!("{f}"));
    let snapshot = report.snapshot().expect("every case ran");
    println!("{snapshot}");
    assert!(
        snapshot.contains("loops: 16 cases of 1 to 8 steps"),
        "{snapshot}"
    );
    assert!(
        snapshot.contains("every step's out, teacher-forced (f32)"),
        "{snapshot}"
    );
    assert!(
        snapshot.contains("every step's out, free-running (f32)"),
        "{snapshot}"
    );
}

#[test]
fn a_sampler_consuming_its_random_numbers_in_another_order_is_named() {
    let scratch = Scratch::new("s_sampler_noise_order");
    let layer = declared_with_store(&sampler("s_sampler_noise_order"), &scratch);
    let msg = golden::check(&layer, &|i: &golden::PortInputs| {
        golden::IntoOutputs::into_outputs(ddpm_step(i, true))
    })
    .expect_err("a wrong port")
    .to_string();
    println!("{msg}");
    assert!(
        msg.contains("leaves its reference `zoo_ref.samplers.ddpm_step` at step 0 of"),
        "{msg}"
    );
    assert!(msg.contains("through the loop"), "{msg}");
    assert!(
        msg.contains(
            "the loop run with its per-step inputs (random numbers) taken in reverse order"
        ),
        "{msg}"
    );
}

/// [`ddpm_step`] that keeps its state in its input's memory, as an in-place update does: the next
/// state is written over the carried `x` (candle's `slice_set`) and `x` returned.
fn ddpm_step_in_place(
    i: &golden::PortInputs,
    noise_by_timestep: bool,
) -> candle_core::Result<Tensor> {
    let next = ddpm_step(i, noise_by_timestep)?;
    let x = i.tensor(0);
    x.slice_set(&next, 0, 0)?;
    Ok(x.clone())
}

#[test]
fn a_sampler_writing_its_next_state_into_its_carried_input_is_judged_on_what_it_returned() {
    // Each step returns the right state, in the memory golden carried in: what golden keeps of a
    // step must be the value it returned, not what the next step writes there.
    let scratch = Scratch::new("s_sampler_in_place");
    let layer = declared_with_store(&sampler("s_sampler_in_place"), &scratch);
    golden::check(&layer, &|i: &golden::PortInputs| {
        golden::IntoOutputs::into_outputs(ddpm_step_in_place(i, false))
    })
    .unwrap_or_else(|f| panic!("the right port failed:\n{f}"));
    // The same writes with the random numbers in the timesteps' order: named as without them.
    let scratch = Scratch::new("s_sampler_in_place_noise_order");
    let layer = declared_with_store(&sampler("s_sampler_in_place_noise_order"), &scratch);
    let msg = golden::check(&layer, &|i: &golden::PortInputs| {
        golden::IntoOutputs::into_outputs(ddpm_step_in_place(i, true))
    })
    .expect_err("a wrong port")
    .to_string();
    println!("{msg}");
    assert!(
        msg.contains("leaves its reference `zoo_ref.samplers.ddpm_step` at step 0 of"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the loop run with its per-step inputs (random numbers) taken in reverse order"
        ),
        "{msg}"
    );
}

#[test]
fn a_cached_port_that_writes_its_next_output_into_the_last_one_is_judged_on_what_it_returned() {
    // A streaming port that reuses one output buffer (written with `slice_set`, as candle-nn's
    // KV cache reuses its own) while the steps' shapes allow: golden keeps what each step returned.
    let layer = Layer::module(
        "s_streaming_reused_buffer",
        "zoo_ref.streaming.StreamingConv",
    )
    .init("channels", 4usize)
    .init("kernel", 3usize)
    .dim("b", 1, 2)
    .dim("t", 1, 10)
    .arg(
        "x",
        ["b".into(), "t".into(), golden::DimExpr::Lit(4)],
        golden::Dist::default(),
    )
    .decode(Decode::over("x"))
    .cases(12);
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(&layer, &scratch);
    let port = move |inputs: &golden::PortInputs| {
        golden::drive(inputs, |inputs| {
            let vb = inputs.var_builder();
            let made = (|| -> candle_core::Result<_> {
                let mut conv = Streaming {
                    weight: vb.get((4, 4, 3), "conv.weight")?,
                    bias: vb.get(4, "conv.bias")?,
                    buffer: None,
                    forget: false,
                };
                let mut reused: Option<Tensor> = None;
                Ok(move |step: &golden::Step| -> candle_core::Result<Tensor> {
                    let out = conv.forward(step.input("x")?)?.contiguous()?;
                    match &reused {
                        Some(buffer) if buffer.dims() == out.dims() => {
                            buffer.slice_set(&out, 1, 0)?;
                            Ok(buffer.clone())
                        }
                        _ => {
                            reused = Some(out.clone());
                            Ok(out)
                        }
                    }
                })
            })();
            golden::IntoStepper::into_stepper(made)
        })
    };
    golden::check(&layer, &port).unwrap_or_else(|f| panic!("the right port failed:\n{f}"));
}

#[test]
fn a_loop_that_can_have_no_steps_is_refused_before_any_case() {
    // A loop of 0 steps compares nothing: refused by the declaration's validation, before any
    // case is drawn (so on every seed, not only on those that draw k = 0).
    let layer = sampler("s_sampler_no_steps").dim("k", 0, 8);
    let msg = golden::check(&layer, &|i: &golden::PortInputs| {
        golden::IntoOutputs::into_outputs(ddpm_step(i, false))
    })
    .expect_err("a loop of no steps")
    .to_string();
    assert!(
        msg.contains(
            "`steps(over = k)`: the loop has as many steps as `k`, which can be 0 (`k` is \
             declared 0..=8): a loop of no steps compares nothing; start `k` at 1"
        ),
        "{msg}"
    );
}

#[test]
fn a_sequence_that_can_be_empty_is_refused_before_any_case() {
    let port = decoder::port(None, Bugs::default());
    let layer = llama("s_llama_empty_prompt").dim("n", 0, 6);
    let msg = golden::check(&layer, &port)
        .expect_err("an empty prompt")
        .to_string();
    assert!(
        msg.contains(
            "`decode` splits `input_ids` along axis 1, whose length `n` can be 0 (`n` is declared \
             0..=6): a schedule of no positions drives nothing; start `n` at 1"
        ),
        "{msg}"
    );
    // A length computed from the dims is refused where it reaches 0 as well.
    let layer = llama("s_llama_empty_prompt_expr").arg(
        "input_ids",
        [
            DimExpr::from("b"),
            DimExpr::Expr(DimValue::Sub(
                Box::new(DimValue::dim("n")),
                Box::new(DimValue::Lit(2)),
            )),
        ],
        golden::Dist::int(0, decoder::VOCAB as i64),
    );
    let msg = golden::check(&layer, &port)
        .expect_err("an empty prompt")
        .to_string();
    assert!(
        msg.contains(
            "`decode` splits `input_ids` along axis 1, whose length `n - 2` can be 0 (at n=2): a \
             schedule of no positions drives nothing"
        ),
        "{msg}"
    );
}

/// What a schedule costs beside a single forward of the same model: the cached Llama of
/// [`decoder`] on 8 tokens, 8 cases each, live, warm worker, median of 3 — the whole sequence in
/// one forward against the same sequence driven through a schedule (a prefill then decode steps or
/// chunks: k steps after the prefill, compared with the cached run and the one-shot forward). Each
/// case is one request either way: one worker and one model for the whole schedule. Printed, not
/// asserted: `cargo xtask bench-schedules`.
#[test]
#[ignore = "a benchmark: cargo xtask bench-schedules"]
fn schedule_cost() {
    use golden::internal::describe::env::Mode;
    let fixed = |layer: Layer| {
        layer
            .dim("b", 1, 1)
            .dim("n", 8, 8)
            .cases(8)
            .mode(Mode::Live)
    };
    let single = fixed(llama("bench_single_forward"))
        .without_schedule()
        .into_owned();
    let scheduled = fixed(llama("bench_schedule"));
    let time = |layer: &Layer| {
        let scratch = Scratch::new(layer.name());
        let layer = declared_with_store(layer, &scratch);
        let started = std::time::Instant::now();
        let report = golden::check(&layer, &decoder::port(None, Bugs::default()))
            .unwrap_or_else(|f| panic!("{f}"));
        (started.elapsed().as_secs_f64(), report)
    };
    time(&single); // a warm worker, torch and transformers imported
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut steps = 0.0;
    for _ in 0..3 {
        a.push(time(&single).0);
        let (t, report) = time(&scheduled);
        b.push(t);
        let cases = &report.runs[0].cases;
        steps = cases
            .iter()
            .map(|c| c.params.steps.as_ref().map_or(1, |s| s.chunks.len()) as f64)
            .sum::<f64>()
            / cases.len() as f64;
    }
    let (a, b) = (median(a) / 8.0, median(b) / 8.0);
    println!(
        "schedule cost, LlamaForCausalLM (2 layers, hidden 16) on 8 tokens, live, per case (median \
         of 3 runs of 8 cases):"
    );
    println!("  one forward of the 8 tokens:          {:.1} ms", a * 1e3);
    println!(
        "  a schedule of 1 + {:.1} steps on average: {:.1} ms ({:.2}x the forward; {:.1} steps = \
         {:.1} forwards' worth of model calls, plus the one-shot forward)",
        steps - 1.0,
        b * 1e3,
        b / a,
        steps,
        steps
    );
    println!("  requests to the worker per case: 1 either way (the whole schedule is one request)");
}

#[test]
fn a_cached_port_s_gradients_are_checked_on_its_prefill() {
    // The gradient check of a port with `decode`: one step over the whole input (the prefill),
    // against PyTorch's autograd of the same forward. The test's port takes candle's fused
    // `softmax_last_dim`, as candle-transformers' models do: it has no backward, and the
    // projections before it get no gradient.
    let layer = llama("s_llama_gradients")
        .dim("b", 1, 1)
        .dim("n", 2, 4)
        .grad(golden::GradSpec::default());
    let scratch = Scratch::new(layer.name());
    let layer = declared_with_store(&layer, &scratch);
    let msg = match golden::check_gradients(&layer, &decoder::port(None, Bugs::default())) {
        Ok(_) => panic!("gradients through a fused softmax passed"),
        Err(f) => f.to_string(),
    };
    assert!(
        !msg.contains(", steps "),
        "a gradient case has no schedule: {msg}"
    );
    assert!(
        msg.contains(
            "`model.layers.0.self_attn.q_proj.weight` gets a gradient in PyTorch and none in the port"
        ) && msg.contains("ops::softmax_last_dim"),
        "{msg}"
    );
}

/// A streaming causal convolution (`zoo_ref.streaming.StreamingConv`): it keeps the last
/// `kernel − 1` frames between calls; the forgetful port starts every call from zeros.
struct Streaming {
    weight: Tensor,
    bias: Tensor,
    buffer: Option<Tensor>,
    forget: bool,
}

impl Streaming {
    fn forward(&mut self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.transpose(1, 2)?.contiguous()?;
        let (b, c, _) = x.dims3()?;
        let k = self.weight.dim(2)?;
        let buffer = match (&self.buffer, self.forget) {
            (Some(buffer), false) => buffer.clone(),
            _ => Tensor::zeros((b, c, k - 1), x.dtype(), x.device())?,
        };
        let full = Tensor::cat(&[&buffer, &x], 2)?;
        let t = full.dim(2)?;
        self.buffer = Some(full.narrow(2, t - (k - 1), k - 1)?);
        full.conv1d(&self.weight, 0, 1, 1, 1)?
            .broadcast_add(&self.bias.reshape((1, c, 1))?)?
            .gelu_erf()?
            .transpose(1, 2)
    }
}

fn streaming(name: &str, forget: bool) -> Result<Report, Failure> {
    let layer = Layer::module(name, "zoo_ref.streaming.StreamingConv")
        .init("channels", 4usize)
        .init("kernel", 3usize)
        .dim("b", 1, 2)
        .dim("t", 1, 10)
        .arg(
            "x",
            ["b".into(), "t".into(), golden::DimExpr::Lit(4)],
            golden::Dist::default(),
        )
        .decode(Decode::over("x"))
        .cases(12);
    let scratch = Scratch::new(name);
    let layer = declared_with_store(&layer, &scratch);
    let port = move |inputs: &golden::PortInputs| {
        golden::drive(inputs, |inputs| {
            let vb = inputs.var_builder();
            let made = (|| -> candle_core::Result<_> {
                let mut conv = Streaming {
                    weight: vb.get((4, 4, 3), "conv.weight")?,
                    bias: vb.get(4, "conv.bias")?,
                    buffer: None,
                    forget,
                };
                Ok(move |step: &golden::Step| conv.forward(step.input("x")?))
            })();
            golden::IntoStepper::into_stepper(made)
        })
    };
    golden::check(&layer, &port)
}

#[test]
fn a_plain_module_keeps_its_own_state_through_the_schedule() {
    streaming("s_streaming_right", false).unwrap_or_else(|f| panic!("{f}"));
    let msg = streaming("s_streaming_forgetful", true)
        .expect_err("a wrong port")
        .to_string();
    println!("{msg}");
    assert!(
        msg.contains("`zoo_ref.streaming.StreamingConv` at step 1"),
        "{msg}"
    );
    assert!(
        msg.contains("the schedule driven with no state kept between calls"),
        "{msg}"
    );
}
