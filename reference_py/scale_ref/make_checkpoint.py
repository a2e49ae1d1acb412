"""Make a checkpoint of a causal LM with `save_pretrained`, random init, nothing downloaded:

    python -m scale_ref.make_checkpoint SHAPE DIR [SEED] [--drop NAME] [--dtype bf16] [--shard SIZE]
                                       [--scale X]

SHAPE is `tiny` or `tiny-qwen2` (a few MB, for tests), `smollm2-135m`, `qwen2.5-0.5b` or
`qwen2.5-1.5b` (the Hugging Face configs of SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-1.5B, tied
embeddings as theirs). Writes DIR/model.safetensors and DIR/config.json, and prints the config as
JSON on stdout. `--drop NAME` leaves the entry NAME out of the file (a checkpoint that does not fit
its module, for the tests). `--dtype bf16` saves the weights in bfloat16, as published checkpoints
are; `--shard SIZE` (`save_pretrained`'s `max_shard_size`, e.g. `1GB`) shards a checkpoint past
that size into `model-0000N-of-0000M.safetensors` with `model.safetensors.index.json`. `--scale X`
multiplies the (tied) embedding by X: logits X times larger, whose rounding error then exceeds
assert_close's bound at some elements (for the tests of the reference's staged evaluation)."""

import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "tiny": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)),
    "tiny-qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        sliding_window=64, max_window_layers=2, use_sliding_window=False)),
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        sliding_window=32768, max_window_layers=21, use_sliding_window=False)),
    "qwen2.5-1.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        sliding_window=32768, max_window_layers=21, use_sliding_window=False)),
}


def _option(argv, flag):
    """The value of `flag VALUE` in argv (None), and argv without them."""
    if flag not in argv:
        return None, argv
    at = argv.index(flag)
    return argv[at + 1], argv[:at] + argv[at + 2:]


def main(argv):
    drop, argv = _option(argv, "--drop")
    dtype, argv = _option(argv, "--dtype")
    shard, argv = _option(argv, "--shard")
    scale, argv = _option(argv, "--scale")
    shape, out = argv[1], argv[2]
    seed = int(argv[3]) if len(argv) > 3 else 0
    config_class, model_class, values = SHAPES[shape]
    torch.manual_seed(seed)
    model = model_class(config_class(**values))
    # Random init leaves norm weights at 1: draw them so that a port that ignores one is seen.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        if scale is not None:
            model.get_input_embeddings().weight.mul_(float(scale))
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    elif dtype not in (None, "f32"):
        sys.exit(f"--dtype {dtype}: f32 or bf16")
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    if drop is not None:
        from safetensors.torch import load_file, save_file

        path = f"{out}/model.safetensors"
        tensors = load_file(path)
        del tensors[drop]
        save_file(tensors, path, metadata={"format": "pt"})
    print(json.dumps(values))


if __name__ == "__main__":
    main(sys.argv)
