"""Hugging Face's Whisper (`transformers`), tiny and random, as the reference of a third-party port:
candle-transformers' `whisper::model::Whisper` (`tests/third_party.rs`). Not imported by `zoo_ref`
itself: importing transformers takes seconds.

The module names of transformers 5 are the ones candle-transformers 0.11 loads
(`model.encoder.layers.0.self_attn.q_proj.weight`, ...), so the state_dict is served as it is, less
two entries candle never reads: the encoder's positional embedding (candle computes the same
sinusoids itself) and `proj_out.weight` (tied to the token embedding, which candle multiplies by).
"""

from transformers import WhisperConfig, WhisperForConditionalGeneration

# Entries of the state_dict the candle port does not load (see the module docstring).
UNREAD = ("model.encoder.embed_positions.weight", "proj_out.weight")


class TinyWhisper(WhisperForConditionalGeneration):
    """`WhisperForConditionalGeneration` from a small config; `forward(mel, tokens)` -> logits.

    `mel` is [batch, num_mel_bins, 2 * max_source_positions] (Whisper's encoder takes exactly that
    many frames), `tokens` [batch, seq] with seq ≤ max_target_positions. `init_std` is larger than
    Whisper's 0.02 so that activations are of order one, as in a trained model."""

    def __init__(self, d_model=16, layers=1, heads=2, num_mel_bins=8, max_source_positions=8,
                 max_target_positions=8, vocab_size=32, init_std=0.5):
        config = WhisperConfig(
            d_model=d_model,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=4 * d_model,
            decoder_ffn_dim=4 * d_model,
            num_mel_bins=num_mel_bins,
            max_source_positions=max_source_positions,
            max_target_positions=max_target_positions,
            vocab_size=vocab_size,
            init_std=init_std,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        )
        super().__init__(config)
        self.register_state_dict_post_hook(_drop_unread)

    def forward(self, mel, tokens):
        return super().forward(input_features=mel, decoder_input_ids=tokens).logits


def _drop_unread(module, state_dict, prefix, local_metadata):
    for name in UNREAD:
        state_dict.pop(prefix + name, None)
