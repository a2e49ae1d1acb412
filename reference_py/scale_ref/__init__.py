"""Whole causal LMs of transformers as candle-transformers' models answer: the logits of the last
position only (candle's `Llama::forward` returns them as [batch, vocab], `qwen2::ModelForCausalLM`
as [batch, 1, vocab]). Subclasses, so that the state_dict (and a `save_pretrained` checkpoint) is
the original's, name for name. Used by `tests/checkpoints.rs` and `cargo xtask bench-scale`."""

from transformers import LlamaForCausalLM, Qwen2ForCausalLM


class LlamaLastLogits(LlamaForCausalLM):
    def forward(self, input_ids):
        return super().forward(input_ids=input_ids).logits[:, -1, :]


class Qwen2LastLogits(Qwen2ForCausalLM):
    def forward(self, input_ids):
        return super().forward(input_ids=input_ids).logits[:, -1:, :]
