//! The port's side of a schedule (`decode(...)`): a port that keeps state between calls, driven
//! through the case's steps.
//!
//! A port with a schedule is a *constructor*: the annotated function builds the model (from the
//! `VarBuilder`, the config values and dims, like any module-form port) and returns a [`Stepper`] —
//! any `FnMut(&Step) -> R` where `R` is what a port may return — that golden calls once per step:
//!
//! ```ignore
//! fn llama(vb: VarBuilder, /* config values */) -> Result<impl FnMut(&golden::Step) -> Result<Tensor>> {
//!     let mut model = Model::new(vb, ...)?;            // its KV cache lives inside
//!     Ok(move |step: &golden::Step| model.forward(step.input("input_ids")?, step.offset()))
//! }
//! ```
//!
//! A cache passed in and out (`forward(x, index_pos, &mut cache)`) is captured the same way. Each
//! [`Step`] carries the step's chunk of the sequence input, the number of positions already seen
//! (`offset`: candle-transformers' `seqlen_offset`, `index_pos`), the position ids and, in a padded
//! batch, the attention mask so far; each step gets copies of its inputs. Outputs become
//! `step.<k>.<leaf>`, kept as copies taken when the step returns; outputs at padded positions are
//! zeros, as on the reference's side (only valid positions are compared): which positions an output
//! holds — all of the step's, or its last, as candle-transformers' models return — is read from the
//! reference's leaf of the same name. With generation, the steps after the prompt feed back the
//! reference's greedy tokens (teacher forcing), or, on the free-running pass, the port's own.
//!
//! Without a schedule (the gradient and training checks of the same port), one step runs the
//! whole input: the prefill, whose outputs keep their plain names.

use crate::describe::outputs::{IntoOutputs, Outputs, PortInputs};
use crate::describe::sampling::{Draw, DrawJob};
use candle_core::{DType, Tensor};
use golden_files::HostTensor;
use std::fmt::Display;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One call of a port that keeps state: the inputs of one step of the schedule.
pub struct Step {
    index: usize,
    offset: usize,
    len: usize,
    names: Arc<Vec<String>>,
    tensors: Vec<Tensor>,
    positions: Tensor,
    mask: Option<Tensor>,
    dims: Arc<Vec<(String, usize)>>,
}

impl Step {
    /// Which step this is, from 0 (the prefill).
    pub fn index(&self) -> usize {
        self.index
    }

    /// How many positions came before this step: the length of the cache the port should have
    /// (candle-transformers' `seqlen_offset`, `index_pos`).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// How many positions this step has (its chunk's length along the sequence axis).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this step has no positions (never, in a schedule golden draws).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The i-th tensor argument, in the order the check declares them; the scheduled one is this
    /// step's chunk.
    pub fn tensor(&self, i: usize) -> &Tensor {
        &self.tensors[i]
    }

    /// The tensor argument named `name` (`step.input("input_ids")`); the scheduled one is this
    /// step's chunk.
    pub fn input(&self, name: &str) -> candle_core::Result<&Tensor> {
        let i = self.names.iter().position(|n| n == name).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "the step has no input `{name}` (its inputs: {})",
                self.names.join(", ")
            ))
        })?;
        Ok(&self.tensors[i])
    }

    /// The position ids of this step's tokens, `[batch, len]` u32: `offset..offset + len`, or in a
    /// padded batch counted over each row's valid tokens (as `generate` derives them from the
    /// attention mask; padded positions get 1).
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }

    /// The attention mask of every position so far, `[batch, offset + len]` u8 (1 valid, 0
    /// padding), in a padded batch; `None` when every position is valid.
    pub fn attention_mask(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }

    /// The value of a dim in this case.
    pub fn dim(&self, name: &str) -> usize {
        self.dims
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |&(_, v)| v)
    }
}

/// A port that keeps state between calls: called once per step of the schedule.
pub trait Stepper {
    /// Run one step; its outputs are named like a port's (`out`, `out.0`, `out.<key>`).
    fn step(&mut self, step: &Step) -> Result<Outputs, String>;

    /// The port's sampler, for a check that generates by sampling (`decode(generate = N,
    /// sample(...))`): [`Sampled`] has one; a plain closure has none.
    fn sampler(&mut self) -> Option<&mut dyn Sampler> {
        None
    }
}

/// A model that keeps state and the sampler that draws its tokens: what the constructor of a port
/// with `decode(generate = N, sample(...))` returns. golden calls `model` once per step, as for
/// any decode, and `sampler` for each token drawn: on the reference's logits (checked exactly
/// where it takes golden's uniforms, in distribution where it draws its own random numbers) and,
/// generating on its own, on the model's.
pub struct Sampled<M, S> {
    /// The model, called once per step.
    pub model: M,
    /// The sampler, called once per token drawn.
    pub sampler: S,
}

impl<M: Stepper, S: Sampler> Stepper for Sampled<M, S> {
    fn step(&mut self, step: &Step) -> Result<Outputs, String> {
        self.model.step(step)
    }

    fn sampler(&mut self) -> Option<&mut dyn Sampler> {
        Some(&mut self.sampler)
    }
}

impl<F, R> Stepper for F
where
    F: FnMut(&Step) -> R,
    R: IntoOutputs,
{
    fn step(&mut self, step: &Step) -> Result<Outputs, String> {
        self(step).into_outputs()
    }
}

/// A port's sampler: one token for a draw.
pub trait Sampler {
    /// The token drawn.
    fn sample(&mut self, draw: &Draw) -> Result<u32, String>;
}

impl<F, R> Sampler for F
where
    F: FnMut(&Draw) -> R,
    R: IntoToken,
{
    fn sample(&mut self, draw: &Draw) -> Result<u32, String> {
        self(draw).into_token()
    }
}

/// What a sampler may return: a token, or a `Result` of one.
pub trait IntoToken {
    /// The token, or the sampler's error.
    fn into_token(self) -> Result<u32, String>;
}

impl IntoToken for u32 {
    fn into_token(self) -> Result<u32, String> {
        Ok(self)
    }
}

impl<E: std::fmt::Display> IntoToken for Result<u32, E> {
    fn into_token(self) -> Result<u32, String> {
        self.map_err(|e| crate::describe::outputs::without_backtrace(&e.to_string()))
    }
}

/// What a port with a schedule returns: a `Result` of a [`Stepper`] (the model it built).
pub trait IntoStepper {
    /// The stepper, or the constructor's error.
    fn into_stepper(self) -> Result<Box<dyn Stepper>, String>;
}

impl<S: Stepper + 'static, E: Display> IntoStepper for Result<S, E> {
    fn into_stepper(self) -> Result<Box<dyn Stepper>, String> {
        match self {
            Ok(s) => Ok(Box::new(s)),
            Err(e) => Err(crate::describe::outputs::without_backtrace(&format!(
                "building the model: {e}"
            ))),
        }
    }
}

/// Drive a port through its schedule: build it with `make`, then call it once per step. The
/// macro's code for a check with `decode(...)`.
pub fn drive(
    inputs: &PortInputs,
    make: impl FnOnce(&PortInputs) -> Result<Box<dyn Stepper>, String>,
) -> Result<Outputs, String> {
    let mut stepper = make(inputs)?;
    let names = Arc::new(inputs.names.clone());
    let dims = Arc::new(inputs.case.dims.clone());
    let Some(schedule) = &inputs.schedule else {
        // One step over the whole input: the prefill (gradient and training checks).
        let first = inputs.tensors.first();
        let (batch, len) = first.map_or((1, 1), |t| {
            (
                t.dims().first().copied().unwrap_or(1),
                t.dims().get(1).copied().unwrap_or(1),
            )
        });
        let step = Step {
            index: 0,
            offset: 0,
            len,
            names,
            tensors: inputs.tensors.clone(),
            positions: positions(None, batch, 0, len).map_err(|e| e.to_string())?,
            mask: None,
            dims,
        };
        return stepper.step(&step);
    };
    if let Some(jobs) = &schedule.draws {
        return draws(stepper.as_mut(), jobs);
    }
    let plan = &schedule.plan;
    let x = &inputs.tensors[plan.arg];
    let err = |k: usize, e: String| format!("at {}: {e}", plan.steps.describe(k));
    let dims_of = |t: &Tensor| (t.dims()[0], t.dims()[plan.axis]);
    let (batch, prompt) = dims_of(x);
    let mask = plan.mask.as_ref().map(HostTensor::to_i64);
    let mut leaves = Vec::new();
    let mut generated: Vec<Tensor> = Vec::new();
    let mut past = 0;
    for (k, len) in plan.steps.lengths().into_iter().enumerate() {
        schedule.at.store(k, Ordering::Relaxed);
        let chunk = if past < prompt {
            x.narrow(plan.axis, past, len)
                .and_then(|c| c.copy())
                .map_err(|e| err(k, e.to_string()))?
        } else {
            let token = &generated[past - prompt];
            let mut shape = vec![batch];
            shape.extend(std::iter::repeat_n(1, x.rank() - 1));
            token
                .to_dtype(x.dtype())
                .and_then(|t| t.reshape(shape))
                .map_err(|e| err(k, e.to_string()))?
        };
        let mut tensors = fresh(&inputs.tensors).map_err(|e| err(k, e.to_string()))?;
        tensors[plan.arg] = chunk;
        let device = x.device();
        let (step_mask, step_positions) = (|| -> candle_core::Result<_> {
            let so_far = mask
                .as_ref()
                .map(|m| mask_upto(m, batch, prompt, past + len));
            let positions = positions(so_far.as_deref(), batch, past, len)?;
            let mask = match so_far {
                Some(values) => Some(Tensor::from_vec(
                    values.iter().map(|&v| v as u8).collect::<Vec<u8>>(),
                    (batch, past + len),
                    device,
                )?),
                None => None,
            };
            Ok((mask, positions.to_device(device)?))
        })()
        .map_err(|e| err(k, e.to_string()))?;
        let step = Step {
            index: k,
            offset: past,
            len,
            names: names.clone(),
            tensors,
            positions: step_positions,
            mask: step_mask,
            dims: dims.clone(),
        };
        let outputs = stepper.step(&step).map_err(|e| err(k, e))?;
        // Kept as the step returned them: a port that writes its next output into this one's
        // memory (`slice_set` into a buffer it reuses) changes nothing golden kept.
        let mut outputs = outputs
            .0
            .into_iter()
            .map(|(name, t)| Ok((name, t.copy()?)))
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(|e| err(k, e.to_string()))?;
        if past < prompt {
            if let Some(m) = &mask {
                outputs = zero_padding(outputs, schedule, k, m, batch, prompt)
                    .map_err(|e| err(k, e.to_string()))?;
            }
        }
        if plan.steps.generate > generated.len() && past + len >= prompt {
            let i = generated.len();
            let token = match (&schedule.forced, &plan.sample) {
                (Some(forced), _) => forced_token(forced, i, device),
                (None, Some(sample)) => sampled(
                    stepper.as_mut(),
                    &outputs,
                    plan.axis,
                    &previous(x, mask.as_deref(), &generated),
                    &sample.uniforms,
                    i,
                ),
                (None, None) => greedy(&outputs, plan.axis),
            }
            .map_err(|e| err(k, e))?;
            generated.push(token);
        }
        leaves.extend(
            outputs
                .into_iter()
                .map(|(name, t)| (format!("step.{k}.{name}"), t)),
        );
        past += len;
    }
    if schedule.forced.is_none() && !generated.is_empty() {
        let tokens = Tensor::stack(&generated, 1)
            .and_then(|t| t.to_dtype(DType::I64))
            .map_err(|e| e.to_string())?;
        leaves.push(("tokens".to_string(), tokens));
    }
    Ok(Outputs(leaves))
}

/// Copies of a step's inputs, storage of their own: a port that writes into its inputs
/// (`slice_set`, an in-place op on their storage) changes neither the inputs of the steps after it
/// nor what golden kept of the steps before it (a step loop's carried state is the previous step's
/// output). The reference's side does the same (`golden_ref/schedule.py`).
pub(crate) fn fresh(tensors: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
    tensors.iter().map(Tensor::copy).collect()
}

/// The mask of positions `0..end` of each row (the prompt's, then 1 for generated positions).
fn mask_upto(mask: &[i64], batch: usize, prompt: usize, end: usize) -> Vec<i64> {
    (0..batch)
        .flat_map(|b| (0..end).map(move |j| if j < prompt { mask[b * prompt + j] } else { 1 }))
        .collect()
}

/// Position ids `[batch, len]` u32 of positions `past..past + len`: counted over valid tokens
/// when there is a mask of the positions so far (`cumsum(mask) − 1`, padding at 1).
fn positions(
    mask: Option<&[i64]>,
    batch: usize,
    past: usize,
    len: usize,
) -> candle_core::Result<Tensor> {
    let end = past + len;
    let values: Vec<u32> = (0..batch)
        .flat_map(|b| {
            let row = mask.map(|m| &m[b * end..(b + 1) * end]);
            let mut seen = 0i64;
            (0..end)
                .map(move |j| match row {
                    None => j as u32,
                    Some(row) => {
                        seen += row[j];
                        if row[j] == 0 {
                            1
                        } else {
                            (seen - 1) as u32
                        }
                    }
                })
                .collect::<Vec<_>>()
                .into_iter()
                .skip(past)
        })
        .collect();
    Tensor::from_vec(values, (batch, len), &candle_core::Device::Cpu)
}

/// The port's outputs of step `k` with zeros at the padded positions they hold, as the reference's
/// are: padded positions are excluded from the comparison on both sides by one rule. Which
/// positions an output holds is read from the reference's leaf of the same name
/// ([`Plan::holds`](crate::describe::schedule::Plan::holds)): all of the step's, or its last
/// (`[b, 1, vocab]`, `[b, vocab]`); an output the reference has no positional leaf for is left as
/// it is.
fn zero_padding(
    outputs: Vec<(String, Tensor)>,
    schedule: &crate::describe::schedule::PortSchedule,
    k: usize,
    mask: &[i64],
    batch: usize,
    prompt: usize,
) -> candle_core::Result<Vec<(String, Tensor)>> {
    use crate::describe::schedule::Holds;
    let plan = &schedule.plan;
    let (past, len) = plan.steps.span(k);
    let valid = |b: usize, j: usize| u8::from(j >= prompt || mask[b * prompt + j] != 0);
    outputs
        .into_iter()
        .map(|(name, t)| {
            let leaf = format!("step.{k}.{name}");
            let holds = schedule
                .reference_shapes
                .iter()
                .find(|(n, _)| *n == leaf)
                .and_then(|(_, reference)| plan.holds(k, reference, t.dims()));
            let positions = match holds {
                None => return Ok((name, t)),
                Some(Holds::Step) => past..past + len,
                Some(Holds::Last) => past + len - 1..past + len,
            };
            let dims = t.dims().to_vec();
            let keep: Vec<u8> = (0..batch)
                .flat_map(|b| positions.clone().map(move |j| valid(b, j)))
                .collect();
            if keep.iter().all(|&v| v == 1) {
                return Ok((name, t));
            }
            // `[batch, 1, ...]`, the step's positions along the axis where the output has them all
            // (the last position's output has one, or no such axis).
            let mut shape = vec![1; dims.len()];
            shape[0] = batch;
            if holds == Some(Holds::Step) {
                shape[plan.axis] = len;
            }
            let keep = Tensor::from_vec(keep, shape, t.device())?.broadcast_as(dims.as_slice())?;
            let zeros = t.zeros_like()?;
            Ok((name, keep.where_cond(&t, &zeros)?))
        })
        .collect()
}

/// Each row's tokens so far: its prompt's valid tokens (`mask`, `[batch, prompt]`, 0 for padding),
/// then those generated.
fn previous(x: &Tensor, mask: Option<&[i64]>, generated: &[Tensor]) -> Vec<Vec<u32>> {
    let ids: Vec<Vec<i64>> = x
        .to_dtype(DType::I64)
        .and_then(|t| t.flatten_from(1)?.to_vec2())
        .unwrap_or_default();
    let columns: Vec<Vec<i64>> = generated
        .iter()
        .map(|t| {
            t.to_dtype(DType::I64)
                .and_then(|t| t.flatten_all()?.to_vec1())
                .unwrap_or_default()
        })
        .collect();
    ids.iter()
        .enumerate()
        .map(|(b, row)| {
            let prompt = row
                .iter()
                .enumerate()
                .filter(|(j, _)| mask.is_none_or(|m| m[b * row.len() + j] != 0))
                .map(|(_, &t)| t as u32);
            prompt
                .chain(columns.iter().filter_map(|c| c.get(b).map(|&t| t as u32)))
                .collect()
        })
        .collect()
}

/// The port's own sampled token after a step (`[batch]`): its sampler on each row's logits at the
/// last position, with golden's uniform of generated token `i`.
fn sampled(
    stepper: &mut dyn Stepper,
    outputs: &[(String, Tensor)],
    axis: usize,
    previous: &[Vec<u32>],
    uniforms: &HostTensor,
    i: usize,
) -> Result<Tensor, String> {
    let logits = last_logits(outputs, axis)?;
    let sampler = stepper.sampler().ok_or_else(no_sampler)?;
    let u = uniforms.to_f64();
    let count = uniforms.shape.get(1).copied().unwrap_or(1);
    let rows = logits.dim(0).map_err(|e| e.to_string())?;
    let mut tokens = Vec::with_capacity(rows);
    for (b, row_previous) in previous.iter().enumerate().take(rows) {
        let row = logits
            .get(b)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| e.to_string())?;
        let draw = Draw::new(row, row_previous.clone(), u[b * count + i]);
        tokens.push(
            sampler
                .sample(&draw)
                .map_err(|e| format!("the sampler: {e}"))?,
        );
    }
    Tensor::new(tokens, logits.device()).map_err(|e| e.to_string())
}

/// The message for a port that samples without a sampler.
fn no_sampler() -> String {
    "`decode(sample(...))` checks the port's sampler, and the port has none: return \
     `golden::Sampled { model, sampler }` from the constructor (the model's closure as `model`, \
     a `FnMut(&golden::Draw) -> Result<u32>` as `sampler`)"
        .to_string()
}

/// A sampler's draws (`PortSchedule::draws`): each job's tokens as `draw.<i>` (`[n]` i64), and
/// `took.<i>` (`[n]` u8, 1 where the sampler took golden's uniform).
fn draws(stepper: &mut dyn Stepper, jobs: &[DrawJob]) -> Result<Outputs, String> {
    let sampler = stepper.sampler().ok_or_else(no_sampler)?;
    let device = candle_core::Device::Cpu;
    let mut leaves = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let logits = Tensor::new(job.logits.as_slice(), &device).map_err(|e| e.to_string())?;
        let mut tokens = Vec::with_capacity(job.uniforms.len());
        let mut took = Vec::with_capacity(job.uniforms.len());
        for &u in &job.uniforms {
            let draw = Draw::new(logits.clone(), job.previous.clone(), u);
            let token = sampler
                .sample(&draw)
                .map_err(|e| format!("the sampler: {e}"))?;
            tokens.push(i64::from(token));
            took.push(u8::from(draw.took_uniform()));
        }
        let n = tokens.len();
        leaves.push((
            format!("draw.{i}"),
            Tensor::from_vec(tokens, n, &device).map_err(|e| e.to_string())?,
        ));
        leaves.push((
            format!("took.{i}"),
            Tensor::from_vec(took, n, &device).map_err(|e| e.to_string())?,
        ));
    }
    Ok(Outputs(leaves))
}

/// The `i`-th of the reference's generated tokens, `[batch]`.
fn forced_token(
    forced: &HostTensor,
    i: usize,
    device: &candle_core::Device,
) -> Result<Tensor, String> {
    forced
        .to_candle(device)
        .and_then(|t| t.narrow(1, i, 1)?.squeeze(1))
        .map_err(|e| e.to_string())
}

/// The greedy token after a step, `[batch]`: the argmax of its logits (the `logits` leaf, or its
/// only float output) at its last position.
fn greedy(outputs: &[(String, Tensor)], axis: usize) -> Result<Tensor, String> {
    last_logits(outputs, axis)?
        .argmax(1)
        .map_err(|e| format!("the greedy token of the step's logits: {e}"))
}

/// The logits of a step's last position, `[batch, vocab]`: its `logits` leaf, or its only output.
fn last_logits(outputs: &[(String, Tensor)], axis: usize) -> Result<Tensor, String> {
    let only = match outputs {
        [one] => Some(one),
        _ => None,
    };
    let logits = outputs
        .iter()
        .find(|(n, _)| n.ends_with(".logits"))
        .or(only)
        .map(|(_, t)| t)
        .ok_or_else(|| {
            let names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
            format!(
                "generating needs the step's logits: return them as the only output or as \
                 `logits` in a map (the step returned {})",
                names.join(", ")
            )
        })?;
    let last = if logits.rank() > 2 {
        let n = logits.dims()[axis];
        logits.narrow(axis, n - 1, 1).and_then(|t| t.squeeze(axis))
    } else {
        Ok(logits.clone())
    };
    last.and_then(|t| t.flatten_from(1))
        .map_err(|e| format!("the last position of the step's logits: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_valid_tokens_in_a_padded_row() {
        // Row 0 whole, row 1 with two pads on the left; a step of 2 after 3 positions.
        let mask = [1, 1, 1, 1, 1, 0, 0, 1, 1, 1];
        let p = positions(Some(&mask), 2, 3, 2).unwrap();
        assert_eq!(p.to_vec2::<u32>().unwrap(), vec![vec![3, 4], vec![1, 2]]);
        let p = positions(None, 1, 4, 1).unwrap();
        assert_eq!(p.to_vec2::<u32>().unwrap(), vec![vec![4]]);
        assert_eq!(mask_upto(&[0, 1, 1, 1], 2, 2, 3), vec![0, 1, 1, 1, 1, 1]);
    }
}
