#!/usr/bin/env python3
"""Reproduce a failed golden check outside the test.

golden copies this file into the failure's folder (`target/golden/failures/<crate>/<check>/`) next to
`case.json` and the case's tensors as `.npy`. Run it with an interpreter that can import the
reference: it loads the inputs (and, in module form, the state_dict), calls the reference again, and
compares the port's outputs with it by the same rule as the test, printing the same numbers. For a
failed gradient check (`"check": "gradients"` in case.json) it computes PyTorch's gradient of
sum(out · cotangent) again, with the cotangents the test drew (`cotangents/`), and compares the
port's gradients with it the same way.

It needs only numpy, and torch for the torch backend; golden's own Python package is used when it
is importable (case.json's import roots include it): `golden_ref.tap` for a reference's own trace
points, `golden_ref.precision` for the gradient's float64 run.
"""

import contextlib
import importlib
import inspect
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def path(kind, name):
    # A name that is not a plain file name (`out.a/b`) has its file under the name case.json maps.
    return os.path.join(HERE, kind, CASE.get("file_names", {}).get(name, name) + ".npy")


def load(kind, name):
    return np.load(path(kind, name), allow_pickle=False)


def num(x, sig=4):
    """Format a number as golden's reports do (4 significant digits, short)."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return {math.inf: "inf", -math.inf: "-inf"}.get(x, "NaN")
    a = abs(x)
    if 1e-3 <= a < 1e5:
        decimals = max(sig - 1 - math.floor(math.log10(a)), 0)
        s = f"{x:.{decimals}f}"
        return s.rstrip("0").rstrip(".") if "." in s else s
    mantissa, exponent = f"{x:.{sig - 1}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def num_pair(a, b):
    """Two numbers with as many digits (4 to 9) as it takes to tell them apart."""
    sig = 4
    while sig < 9 and a != b and num(a, sig) == num(b, sig):
        sig += 1
    return num(a, sig), num(b, sig)


def resolve(path):
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import `{path}` (import roots: {CASE['import_roots']})")


def flatten(out, prefix="out"):
    if hasattr(out, "detach") or isinstance(out, np.ndarray):
        return [(prefix, out)]
    if isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "__getitem__")):
        return [leaf for k in out.keys() for leaf in flatten(out[k], f"{prefix}.{k}")]
    if isinstance(out, (tuple, list)):
        return [leaf for i, v in enumerate(out) if v is not None for leaf in flatten(v, f"{prefix}.{i}")]
    raise TypeError(f"`{prefix}` is a {type(out).__name__}, not a tensor")


def state_dict(torch, tensor):
    """The module's state as the case had it: the entries written to `state_dict/`, and those of a
    checkpoint (case.json's `checkpoint`: golden refers to its files instead of copying them, one
    file or a sharded checkpoint's index and shards) read from the files, after checking that their
    hash is still the one the test saw."""
    state = {k: tensor("state_dict", k, d) for k, d in CASE["state_dict_dtypes"].items()}
    checkpoint = CASE.get("checkpoint")
    if checkpoint:
        from safetensors import safe_open

        files = checkpoint.get("files") or [checkpoint["path"]]
        size = sum(os.path.getsize(f) for f in files)
        if size != checkpoint["size"]:
            sys.exit(f"{checkpoint['path']} is not the checkpoint the test used (its size changed): "
                     "re-run the test")
        try:
            import xxhash

            hasher = xxhash.xxh3_128()
            for name in files:
                with open(name, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 24), b""):
                        hasher.update(chunk)
            digest = hasher.hexdigest()
            if digest != checkpoint["hash"]:
                sys.exit(f"{checkpoint['path']} is not the checkpoint the test used (hash {digest}, "
                         f"the test's {checkpoint['hash']}): re-run the test")
        except ImportError:
            pass  # the size was checked; xxhash is not installed to check the content too
        dtypes = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}
        opened = {}
        with contextlib.ExitStack() as stack:
            for name, (in_file, dtype, *holder) in checkpoint["entries"].items():
                holder = holder[0] if holder and holder[0] else checkpoint["path"]
                if holder not in opened:
                    opened[holder] = stack.enter_context(safe_open(holder, framework="pt"))
                t = opened[holder].get_tensor(in_file)
                state[name] = t.to(dtypes[dtype]) if dtype in dtypes and t.is_floating_point() else t
    return state


def run_reference():
    obj = resolve(CASE["reference"])
    kwargs = CASE["kwargs"]
    if CASE["backend"] == "numpy":
        args = [load("inputs", name) for name in CASE["args"]]
        return {k: np.asarray(v, dtype=np.float64) for k, v in flatten(obj(*args, **kwargs))}
    import torch

    torch.set_num_threads(1)
    dtypes = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}

    def tensor(kind, name, dtype):
        t = torch.from_numpy(load(kind, name))
        return t.to(dtypes[dtype]) if dtype in dtypes else t

    args = [tensor("inputs", name, CASE["arg_dtypes"][name]) for name in CASE["args"]]
    target = obj
    if CASE["form"] == "module":
        torch.manual_seed(CASE["seed"])
        build_args, init = (), dict(CASE["init"])
        if CASE.get("config"):
            # Built from a configuration object, as golden's worker builds it.
            config = resolve(CASE["config"]["class"])(**CASE["config"]["values"])
            try:
                takes_keyword = "config" in inspect.signature(obj).parameters
            except (TypeError, ValueError):
                takes_keyword = False
            if takes_keyword:
                init["config"] = config
            else:
                build_args = (config,)
        # Built as golden's worker builds it (as `from_pretrained(dtype=...)` does): in float16 and
        # bfloat16, under that default dtype, the buffers the module computes (not in its
        # state_dict: Llama's rotary frequencies) kept in the dtype its code gives them.
        half = CASE["dtype"] in ("f16", "bf16")
        before = torch.get_default_dtype()
        if half:
            torch.set_default_dtype(dtypes[CASE["dtype"]])
        try:
            target = obj(*build_args, **init).eval()
        finally:
            torch.set_default_dtype(before)
        computed = [
            (owner, key, owner._buffers[key])
            for owner in target.modules()
            for key in getattr(owner, "_non_persistent_buffers_set", ())
            if owner._buffers.get(key) is not None and owner._buffers[key].is_floating_point()
        ] if half else []
        target = target.to(dtypes[CASE["dtype"]])
        for owner, key, value in computed:
            owner._buffers[key] = value
        target.load_state_dict(state_dict(torch, tensor))
    recorded = []
    taps = contextlib.nullcontext()
    if CASE.get("trace") and isinstance(target, torch.nn.Module):
        # The trace points, as the worker records them: every submodule's output, and what the
        # reference taps itself (golden_ref.tap), in order.
        calls = {}

        def record(name, output):
            for leaf, value in flatten(output, name):
                calls[leaf] = calls.get(leaf, 0) + 1
                suffix = f"#{calls[leaf]}" if calls[leaf] > 1 else ""
                recorded.append((f"trace.{leaf}{suffix}", value.detach().clone()))

        for name, module in target.named_modules():
            if name:
                def hook(_m, _i, output, name=name):
                    try:
                        record(name, output)
                    except TypeError:
                        return
                module.register_forward_hook(hook)
        try:
            from golden_ref.tap import recording
        except ImportError:  # the reference does not tap (golden's reference_py is not on the path)
            pass
        else:
            taps = recording(record)
    torch.manual_seed(CASE["seed"])
    with torch.no_grad(), taps:
        out = target(*args, **kwargs)
    leaves = flatten(out) + recorded
    return {k: v.detach().to(torch.float64).numpy() if v.is_floating_point() else v.numpy() for k, v in leaves}


def run_gradients():
    """PyTorch's gradients of L = Σ sum(out · cotangent), as the test computed the ones it judged
    the port by: in float64 (inputs, cotangents and parameters upcast from the case dtype, the
    reference's own upcasts promoted to float64 when golden's `precision` module is importable),
    then rounded to the case dtype. Every float input and every parameter is differentiated; the
    leaves the test compared are `grad.<name>`."""
    import torch

    torch.set_num_threads(1)
    obj = resolve(CASE["reference"])
    dtypes = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}
    case_dtype = dtypes[CASE["dtype"]]

    def tensor(kind, name, dtype):
        t = torch.from_numpy(load(kind, name))
        return t.to(dtypes[dtype]) if dtype in dtypes else t

    def wide(t):
        return t.to(torch.float64) if t.is_floating_point() else t

    args = [wide(tensor("inputs", n, CASE["arg_dtypes"][n])) for n in CASE["args"]]
    cotangents = {n: wide(tensor("cotangents", n, CASE["cotangent_dtypes"][n])) for n in CASE["cotangents"]}
    target = obj
    if CASE["form"] == "module":
        torch.manual_seed(CASE["seed"])
        target = obj(**CASE["init"]).eval().to(case_dtype)
        target.load_state_dict(state_dict(torch, tensor))
        target = target.to(torch.float64)
    try:
        from types import SimpleNamespace

        from golden_ref.precision import promoted

        precision = promoted(SimpleNamespace(torch=torch))
    except ImportError:
        print("  note: golden_ref.precision is not importable: the reference's own upcasts "
              "(.to(torch.float32)) are not promoted to float64 as in the test")
        precision = contextlib.nullcontext()
    torch.manual_seed(CASE["seed"])
    with torch.enable_grad(), precision:
        inputs = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        outputs = dict(flatten(target(*inputs, **CASE["kwargs"])))
        total = sum((outputs[n] * c).sum() for n, c in cotangents.items())
        targets = [(n, x) for n, x in zip(CASE["args"], inputs) if x.requires_grad]
        if isinstance(target, torch.nn.Module):
            targets += list(target.named_parameters())
        grads = torch.autograd.grad(total, [x for _, x in targets], allow_unused=True)
    return {
        f"grad.{n}": g.to(case_dtype).to(torch.float64).numpy()
        for (n, _), g in zip(targets, grads)
        if g is not None
    }


def compare(name, leaf, fresh):
    port = load("port", name).astype(np.float64)
    shape = list(port.shape)
    ref = np.asarray(fresh, dtype=np.float64)
    stored = load("reference", name).astype(np.float64)
    same = ref.shape == stored.shape and np.array_equal(ref, stored, equal_nan=True)
    print(f"  leaf `{name}` ({leaf['dtype']} {shape}): reference run again "
          + ("gives exactly what the test saw" if same else "DIFFERS from what the test saw"))
    if ref.shape != port.shape:
        print(f"    shape {shape} but the reference's is {list(ref.shape)}")
        return
    rule = leaf["rule"]
    if rule == "exact":
        bad = port != ref
        print(f"  leaf `{name}`: {int(bad.sum())} / {port.size} elements differ (exact)")
        return
    rounding = load("rounding", name).astype(np.float64) if rule["factor"] > 0 else np.zeros_like(ref)
    # As the test reads the estimate: NaN, no rounding term (at a NaN or Inf of the reference that
    # its float64 run does not explain: not judged, a difference); -inf, not judged at all.
    unreliable = rounding == -np.inf
    unjudged = np.isnan(rounding) & ~np.isfinite(ref)
    rounding = np.where(np.isfinite(rounding), rounding, 0.0)
    finite = np.isfinite(port) & np.isfinite(ref)
    diff = np.where(finite, np.abs(port - ref), 0.0)
    allowed = rule["atol"] + rule["rtol"] * np.abs(ref) + rule["factor"] * rounding
    same_nonfinite = ((np.isnan(port) & np.isnan(ref)) | (port == ref)) & ~unjudged
    bad = np.where(finite, diff > allowed, ~same_nonfinite) & ~(unreliable & np.isfinite(port))
    print(f"  leaf `{name}` ({leaf['dtype']} {shape}): {int(bad.sum())} / {port.size} elements differ "
          f"({100.0 * bad.sum() / max(port.size, 1):.1f}%)")
    if finite.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(ref != 0, diff / np.abs(ref), np.where(diff > 0, np.inf, 0.0))
        for kind, values in (("absolute", diff), ("relative", rel)):
            # The first greatest over the finite pairs, as the test picks it.
            i = int(np.argmax(np.where(finite, values, -1.0)))
            at = [int(k) for k in np.unravel_index(i, port.shape)] if port.ndim else []
            p, r = num_pair(port.flat[i], ref.flat[i])
            print(f"    greatest {kind} difference {num(values.flat[i])} at {at}: port {p}, "
                  f"reference {r} (allowed {num(allowed.flat[i])})")
    print(f"    NaN: port {int(np.isnan(port).sum())}, reference {int(np.isnan(ref).sum())}; "
          f"Inf: port {int(np.isinf(port).sum())}, reference {int(np.isinf(ref).sum())}")


def main():
    global CASE
    with open(os.path.join(HERE, "case.json")) as f:
        CASE = json.load(f)
    for root in reversed(CASE["import_roots"]):
        sys.path.insert(0, root)
    gradients = CASE.get("check") == "gradients"
    if gradients:
        print(f"golden repro: the gradients of `{CASE['layer']}` against PyTorch's of "
              f"`{CASE['reference']}` in {CASE['dtype']}")
        print(f"  case: {CASE['case']}")
        print("  L = " + " + ".join(f"sum({n} · cotangent)" for n in CASE["cotangents"])
              + "; the cotangents are in cotangents/")
        outputs = run_gradients()
    else:
        print(f"golden repro: `{CASE['layer']}` against `{CASE['reference']}` in {CASE['dtype']}")
        print(f"  case: {CASE['case']}")
        outputs = run_reference()
    for name, leaf in CASE["leaves"].items():
        if name not in outputs:
            print(f"  leaf `{name}`: the reference no longer "
                  + ("gives this gradient" if gradients else "returns it"))
            continue
        if not os.path.exists(path("port", name)):
            print(f"  leaf `{name}`: not tapped by the port")
            continue
        compare(name, leaf, outputs[name])
    print(f"  re-run this case in Rust: {CASE['rerun']}")


CASE = None

if __name__ == "__main__":
    main()
