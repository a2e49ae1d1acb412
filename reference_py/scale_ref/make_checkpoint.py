"""Make a checkpoint of a causal LM with `save_pretrained`, random init, nothing downloaded:

    python -m scale_ref.make_checkpoint SHAPE DIR [SEED] [--drop NAME]

SHAPE is `tiny` or `tiny-qwen2` (a few MB, for tests), `smollm2-135m` or `qwen2.5-0.5b` (the Hugging Face configs
of SmolLM2-135M and Qwen2.5-0.5B, tied embeddings as theirs). Writes DIR/model.safetensors and
DIR/config.json, and prints the config as JSON on stdout. `--drop NAME` leaves the entry NAME out
of the file (a checkpoint that does not fit its module, for the tests)."""

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
}


def main(argv):
    drop = None
    if "--drop" in argv:
        at = argv.index("--drop")
        drop = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
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
    model.save_pretrained(out)
    if drop is not None:
        from safetensors.torch import load_file, save_file

        path = f"{out}/model.safetensors"
        tensors = load_file(path)
        del tensors[drop]
        save_file(tensors, path, metadata={"format": "pt"})
    print(json.dumps(values))


if __name__ == "__main__":
    main(sys.argv)
