//! Candle ports of Llama's layers, each checked against the Hugging Face class it ports
//! (`transformers.models.llama.modeling_llama`, transformers 5.23) with golden: `cargo test` runs
//! the real transformers code on the same generated inputs.
//!
//! * [`norm::rms_norm`] — `LlamaRMSNorm`, with its gradients;
//! * [`mlp::llama_mlp`] — `LlamaMLP` (SwiGLU) built from a `LlamaConfig` whose sizes are drawn per
//!   case, with its gradients and a training check;
//! * [`rope::apply_rotary_pos_emb`] — the rotary embedding (`rotate_half`), with its gradients;
//! * [`model::llama_model`] — `LlamaModel` with one decoder layer: embedding, RMSNorm, attention
//!   with RoPE and grouped KV heads (GQA), the MLP, the final norm; traced point by point, in
//!   float32 and bfloat16, over a configuration sweep (`head_dim` that is `hidden / heads` or not,
//!   attention biases or none);
//! * [`decode::cached_llama`] — `LlamaForCausalLM` with a KV cache, driven through generated
//!   schedules (prefill and decode steps, chunked prefills, padded batches), and
//!   [`decode::greedy_llama`], greedy generation teacher-forced and free-running.

pub mod decode;
pub mod mlp;
pub mod model;
pub mod norm;
pub mod rope;
