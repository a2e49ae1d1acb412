//! The shapes of `cargo xtask bench-scale` (SmolLM2-135M's, Qwen2.5-0.5B's and Qwen2.5-1.5B's
//! Hugging Face configs, as `reference_py/scale_ref/make_checkpoint.py` writes them) and candle-transformers'
//! models for them, unmodified: what the golden check and the hand-written program both run.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{Activation, VarBuilder};
use candle_transformers::models::{llama, qwen2};

/// A shape of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A few MB (the quick form).
    Tiny,
    /// SmolLM2-135M's config (Llama).
    Smollm2,
    /// Qwen2.5-0.5B's config (Qwen2).
    Qwen25,
    /// Qwen2.5-1.5B's config (Qwen2): checked on a bf16, sharded checkpoint.
    Qwen15,
}

impl Shape {
    pub fn parse(name: &str) -> Option<Shape> {
        Some(match name {
            "tiny" => Shape::Tiny,
            "smollm2-135m" => Shape::Smollm2,
            "qwen2.5-0.5b" => Shape::Qwen25,
            "qwen2.5-1.5b" => Shape::Qwen15,
            _ => return None,
        })
    }

    /// The reference: transformers' class, its logits at the last position as candle's returns them.
    pub fn reference(self) -> &'static str {
        match self {
            Shape::Qwen25 | Shape::Qwen15 => "scale_ref.Qwen2LastLogits",
            _ => "scale_ref.LlamaLastLogits",
        }
    }

    pub fn config_class(self) -> &'static str {
        match self {
            Shape::Qwen25 | Shape::Qwen15 => "transformers.Qwen2Config",
            _ => "transformers.LlamaConfig",
        }
    }

    /// (name, value) of the configuration, as `make_checkpoint.py` has it.
    pub fn config_values(self) -> Vec<(&'static str, golden::Value)> {
        use golden::Value::{Bool, Float, Int};
        let c = self.llama();
        let mut v = vec![
            ("vocab_size", Int(c.vocab_size as i64)),
            ("hidden_size", Int(c.hidden_size as i64)),
            ("intermediate_size", Int(c.intermediate_size as i64)),
            ("num_hidden_layers", Int(c.num_hidden_layers as i64)),
            ("num_attention_heads", Int(c.num_attention_heads as i64)),
            ("num_key_value_heads", Int(c.num_key_value_heads as i64)),
            (
                "max_position_embeddings",
                Int(c.max_position_embeddings as i64),
            ),
            ("rms_norm_eps", Float(c.rms_norm_eps)),
            ("rope_theta", Float(c.rope_theta as f64)),
            ("tie_word_embeddings", Bool(true)),
        ];
        if matches!(self, Shape::Qwen25 | Shape::Qwen15) {
            v.push(("sliding_window", Int(32768)));
            v.push(("max_window_layers", Int(21)));
            v.push(("use_sliding_window", Bool(false)));
        }
        v
    }

    pub fn vocab(self) -> usize {
        self.llama().vocab_size
    }

    /// The configuration as candle's Llama reads it (Qwen2's is made from it).
    pub fn llama(self) -> llama::Config {
        let (vocab, hidden, inter, layers, heads, kv, positions, eps, theta) = match self {
            Shape::Tiny => (96, 32, 64, 2, 4, 2, 64, 1e-5, 10_000.0),
            Shape::Smollm2 => (49152, 576, 1536, 30, 9, 3, 8192, 1e-5, 100_000.0),
            Shape::Qwen25 => (151936, 896, 4864, 24, 14, 2, 32768, 1e-6, 1_000_000.0),
            Shape::Qwen15 => (151936, 1536, 8960, 28, 12, 2, 32768, 1e-6, 1_000_000.0),
        };
        llama::Config {
            hidden_size: hidden,
            intermediate_size: inter,
            vocab_size: vocab,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            use_flash_attn: false,
            rms_norm_eps: eps,
            rope_theta: theta,
            bos_token_id: None,
            eos_token_id: None,
            rope_scaling: None,
            max_position_embeddings: positions,
            tie_word_embeddings: true,
        }
    }

    fn qwen2(self) -> qwen2::Config {
        let c = self.llama();
        qwen2::Config {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: c.num_key_value_heads,
            max_position_embeddings: c.max_position_embeddings,
            sliding_window: 32768,
            max_window_layers: 21,
            tie_word_embeddings: true,
            rope_theta: c.rope_theta as f64,
            rms_norm_eps: c.rms_norm_eps,
            use_sliding_window: false,
            hidden_act: Activation::Silu,
        }
    }
}

/// A loaded model of a shape.
pub enum Model {
    Llama(llama::Llama, llama::Config),
    Qwen2(qwen2::ModelForCausalLM),
}

impl Model {
    /// candle-transformers' model of `shape`, from `vb`.
    pub fn load(shape: Shape, vb: VarBuilder) -> Result<Model> {
        Ok(match shape {
            Shape::Qwen25 | Shape::Qwen15 => {
                Model::Qwen2(qwen2::ModelForCausalLM::new(&shape.qwen2(), vb)?)
            }
            _ => Model::Llama(llama::Llama::load(vb, &shape.llama())?, shape.llama()),
        })
    }

    /// The logits at the last position (Llama: [b, vocab]; Qwen2: [b, 1, vocab]).
    pub fn last_logits(&mut self, input_ids: &Tensor) -> Result<Tensor> {
        match self {
            Model::Llama(model, config) => {
                let mut cache = llama::Cache::new(false, DType::F32, config, &Device::Cpu)?;
                model.forward(input_ids, 0, &mut cache)
            }
            Model::Qwen2(model) => {
                model.clear_kv_cache();
                model.forward(input_ids, 0)
            }
        }
    }
}

/// This process's peak resident memory (VmHWM), in bytes.
pub fn peak_rss(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A wrong port's input ids: shifted by one (a tokenizer's off-by-one), with the embedding of the
/// shifted ids tapped (`model.embed_tokens`): the one point of candle-transformers' model a port can
/// tap from outside, read from the same VarBuilder.
pub fn shifted_with_embedding_tap(shape: Shape, vb: VarBuilder, ids: &Tensor) -> Result<Tensor> {
    let vocab = shape.vocab();
    let plus_one: Vec<f32> = ids
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(|i| (i + 1.0) % vocab as f32)
        .collect();
    let shifted = Tensor::from_vec(plus_one, ids.shape(), ids.device())?.to_dtype(ids.dtype())?;
    let embedding = candle_nn::embedding(
        vocab,
        shape.llama().hidden_size,
        vb.pp("model.embed_tokens"),
    )?;
    golden::tap(
        "model.embed_tokens",
        &candle_core::Module::forward(&embedding, &shifted)?,
    );
    Ok(shifted)
}

/// The bytes of the files under `dir`.
pub fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
