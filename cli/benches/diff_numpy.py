"""The NumPy side of `cargo xtask bench-diff`.

`make DIR` writes two dump folders, DIR/a and DIR/b, shaped like a layer-by-layer dump of a
25-block model (300 float32 .npy files, 225 MiB per folder), each with the dump's order in
`order.txt`. B is A with rounding-level noise,
except that from block 13's `post_attn` on it carries a real error, as a port bug would.

`compare A B` is what a user's hand-written script would do with NumPy: load each pair, compute
the figures `golden diff` prints (max/mean absolute and relative difference over finite pairs,
cosine similarity, NaN/Inf counts, elements outside assert_close's float32 tolerance) in natural
layer order, and name the first tensor that differs.
"""

import os
import sys

import numpy as np

STAGES = [
    "pre_attn", "q", "k", "v", "scores", "attn", "post_attn",
    "pre_mlp", "mlp_up", "mlp_act", "mlp_down", "post_mlp",
]
WIDE = {"mlp_up", "mlp_act"}
BLOCKS = 25
BUG_BLOCK, BUG_STAGE = 13, "post_attn"
# torch.testing.assert_close's defaults for float32.
RTOL, ATOL = 1.3e-6, 1e-5


def make(root):
    rng = np.random.default_rng(0)
    for side in ("a", "b"):
        os.makedirs(os.path.join(root, side), exist_ok=True)
    buggy = False
    order = []
    for block in range(BLOCKS):
        for stage in STAGES:
            shape = (4, 128, 1024 if stage in WIDE else 256)
            a = rng.standard_normal(shape, dtype=np.float32)
            buggy = buggy or (block, stage) == (BUG_BLOCK, BUG_STAGE)
            noise = 1e-3 if buggy else 2e-7
            b = a + (noise * rng.standard_normal(shape, dtype=np.float32)) * a
            name = f"{block}_{stage}.npy"
            np.save(os.path.join(root, "a", name), a)
            np.save(os.path.join(root, "b", name), b.astype(np.float32))
            order.append(name)
    # The dump's order, for `golden diff` (the names alone leave a block's stages unordered).
    for side in ("a", "b"):
        with open(os.path.join(root, side, "order.txt"), "w") as f:
            f.write("\n".join(order) + "\n")


def dump_order(name):
    # Block number, then the stage's place in the forward pass (plain sorting would put
    # `13_mlp_act` before `13_post_attn`); the script's author knows the dump's stages.
    block, stage = name.removesuffix(".npy").split("_", 1)
    return int(block), STAGES.index(stage)


def figures(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    nan = (int(np.isnan(a).sum()), int(np.isnan(b).sum()))
    inf = (int(np.isinf(a).sum()), int(np.isinf(b).sum()))
    both = np.isfinite(a) & np.isfinite(b)
    x, y = a[both], b[both]
    d = np.abs(x - y)
    nonzero = x != 0
    rel = d[nonzero] / np.abs(x[nonzero])
    outside = ~(d <= ATOL + RTOL * np.abs(x))
    worst = int(np.argmax(d - (ATOL + RTOL * np.abs(x)))) if d.size else None
    return {
        "max_abs": float(d.max(initial=0.0)),
        "mean_abs": float(d.mean()) if d.size else 0.0,
        "max_rel": float(rel.max(initial=0.0)),
        "mean_rel": float(rel.mean()) if rel.size else 0.0,
        "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))),
        "nan": nan,
        "inf": inf,
        "mismatched": int(outside.sum()),
        "worst": worst,
    }


def compare(dir_a, dir_b):
    common = set(os.listdir(dir_a)) & set(os.listdir(dir_b))
    names = sorted((n for n in common if n.endswith(".npy")), key=dump_order)
    first = None
    for name in names:
        a = np.load(os.path.join(dir_a, name))
        b = np.load(os.path.join(dir_b, name))
        if a.shape != b.shape:
            first = first or name
            continue
        if figures(a, b)["mismatched"] and first is None:
            first = name
    print(f"{len(names)} tensors compared; first divergent: {first}")
    return 1 if first else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make(sys.argv[2])
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("usage: diff_numpy.py make DIR | compare A B")
