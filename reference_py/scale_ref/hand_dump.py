"""`cargo xtask bench-scale`'s hand-written baseline, Python side: what a porter writes without
golden. Loads the checkpoint with `from_pretrained`, runs CASES cases of [1, TOKENS] random input ids
and saves each case's input ids and last-position logits as .npy:

    python -m scale_ref.hand_dump SHAPE CHECKPOINT_DIR OUT [CASES] [TOKENS]

Prints one line, `wall_s=.. peak_self=..` (its own wall time from the interpreter's start, and its
peak resident memory)."""

import resource
import sys
import time

import numpy as np
import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM


def main(argv):
    shape, checkpoint, out = argv[1], argv[2], argv[3]
    cases = int(argv[4]) if len(argv) > 4 else 4
    tokens = int(argv[5]) if len(argv) > 5 else 32
    model_class = Qwen2ForCausalLM if shape == "qwen2.5-0.5b" else LlamaForCausalLM
    model = model_class.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    for k in range(cases):
        ids = rng.integers(0, vocab, size=(1, tokens), dtype=np.int64)
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ids)).logits[:, -1, :]
        np.save(f"{out}/case{k}_input_ids.npy", ids)
        np.save(f"{out}/case{k}_logits.npy", logits.numpy())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"wall_s={time.time() - START:.2f} peak_self={peak}")


START = time.time()

if __name__ == "__main__":
    main(sys.argv)
