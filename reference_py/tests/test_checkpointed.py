"""A checkpoint's whole model in the worker (`golden_ref.checkpointed`, `golden_ref.states` and the
staged evaluation of `golden_ref.evaluate.forward`): built without its parameters' memory, evaluated
in the case dtype and in float64 as a model loaded in that dtype would be, its mapped pages given
back module by module, and the stages of its evaluation reusing what the stages before made."""

import os
import shutil
import tempfile
import unittest

import numpy as np

try:
    import torch
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None

try:
    import transformers
except ImportError:
    transformers = None

from golden_ref import backends, checkpointed, evaluate
from golden_ref.states import State
from golden_ref.wire import WireTensor

VALUES = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)


def _save(directory, values=VALUES, dtype=None, shard=None, seed=0):
    """A LlamaForCausalLM of `values` saved with save_pretrained (norm weights drawn, as
    scale_ref.make_checkpoint does)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**values))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))


def _state(directory):
    """The worker's state of the checkpoint in `directory`, as the runtime describes it: every
    state_dict entry by its name in the files (the tied head by the embedding's)."""
    import json

    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        from safetensors import safe_open

        with safe_open(os.path.join(directory, "model.safetensors"), framework="np") as f:
            weight_map = {name: "model.safetensors" for name in f.keys()}
    names = sorted(set(weight_map.values()))
    files = []
    for name in names:
        st = os.stat(os.path.join(directory, name))
        files.append({"path": os.path.join(directory, name), "size": st.st_size,
                      "mtime_ns": str(st.st_mtime_ns)})
    entries = [[t, [names.index(f), t]] for t, f in weight_map.items()]
    entries.append(["lm_head.weight", [names.index(weight_map["model.embed_tokens.weight"]),
                                       "model.embed_tokens.weight"]])
    return State({"id": "test", "files": files, "entries": entries}, [])


class _Reference:
    """scale_ref.LlamaLastLogits, resolved as the worker resolves it."""

    @staticmethod
    def get():
        from scale_ref import LlamaLastLogits

        return LlamaLastLogits


def _case(state, ids, dtype="f32", values=VALUES):
    from transformers import LlamaConfig

    case = evaluate.Case(_Reference.get(), "module", backends.TorchBackend(), [WireTensor("i64", ids)],
                         {}, {}, 1, dtype)
    case.config = (LlamaConfig, dict(values))
    case.checkpoint = state
    case.state = state.entries
    return case


def _resident(path):
    """The bytes of `path` this process has mapped in (its resident pages, /proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and all(c in "0123456789abcdef-" for c in first):
                ours = line.rstrip("\n").endswith(path)
            elif ours and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class CheckpointedTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="golden-checkpointed-")
        self.ids = np.random.default_rng(0).integers(0, 96, size=(2, 7)).astype(np.int64)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_parameters_on_the_meta_device_and_buffers_as_the_code_makes_them(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        with checkpointed.parameters_on_meta(torch):
            empty = LlamaForCausalLM(LlamaConfig(**VALUES))
        built = LlamaForCausalLM(LlamaConfig(**VALUES))
        self.assertTrue(all(p.is_meta for p in empty.parameters()))
        self.assertEqual(checkpointed.still_on_meta(empty), [n for n, _ in empty.state_dict().items()])
        inv_freq = dict(empty.named_buffers())["model.rotary_emb.inv_freq"]
        self.assertFalse(inv_freq.is_meta)
        self.assertTrue(torch.equal(inv_freq, dict(built.named_buffers())["model.rotary_emb.inv_freq"]))
        # The tie is one parameter, as in a module built as usual.
        self.assertIs(empty.lm_head.weight, empty.model.embed_tokens.weight)
        # And torch's own registration is back.
        self.assertFalse(torch.nn.Linear(2, 2).weight.is_meta)

    def test_the_parameter_list_of_a_checkpoints_module_is_the_modules_without_initialising_it(self):
        from transformers import LlamaConfig

        case = evaluate.Case(_Reference.get(), "module", backends.TorchBackend(), [], {}, {}, 0, "f32")
        for tied in (True, False):
            case.config = (LlamaConfig, dict(VALUES, tie_word_embeddings=tied))
            drawn, _ = evaluate.param_spec(case)
            listed, _ = evaluate.param_spec(case, weights=True)
            strip = lambda spec: [(e["name"], e["shape"], e["buffer"], e["float"]) for e in spec["entries"]]  # noqa: E731
            self.assertEqual(strip(listed), strip(drawn))
            self.assertEqual(listed["aliases"], drawn["aliases"])
            self.assertEqual(listed.get("unsaved"), drawn.get("unsaved"))
            self.assertTrue(all("mean" not in e for e in listed["entries"]))

    def test_a_sharded_bf16_checkpoint_evaluates_in_f32_as_from_pretrained_does_without_a_copy(self):
        from transformers import LlamaForCausalLM

        _save(self.dir, dtype=torch.bfloat16, shard="20KB")
        state = _state(self.dir)
        self.assertGreater(len(state.spec["files"]), 1)
        case = _case(state, self.ids)
        result = evaluate.forward(case, perturbations=2)
        loaded = LlamaForCausalLM.from_pretrained(self.dir, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = loaded(input_ids=torch.from_numpy(self.ids)).logits[:, -1, :]
        (name, out), = result["expected"]
        self.assertEqual(out.dtype, "f32")
        self.assertTrue(np.array_equal(out.array, expected.numpy()), np.abs(out.array - expected.numpy()).max())
        # The module keeps the file's bf16 tensors: no float32 copy of them was made to keep.
        module = evaluate.build_module(case)
        self.assertEqual({p.dtype for p in module.parameters()}, {torch.bfloat16})
        # The float64 answer is the same computation, to rounding.
        (_, high), = result["precise"]
        self.assertLess(np.abs(high.array - expected.numpy()).max(), 1e-4)

    def test_the_float64_pass_upcasts_a_large_weight_a_slice_at_a_time_to_the_same_answer(self):
        _save(self.dir)
        state = _state(self.dir)
        case = _case(state, self.ids)
        module = evaluate.build_module(case)
        whole = evaluate._evaluate64(case, module, case.args, "whole")
        before = checkpointed.SLICE_BYTES
        checkpointed.SLICE_BYTES = 1024  # the head (96 × 32) in slices of 4 rows
        try:
            sliced = evaluate._evaluate64(case, module, case.args, "sliced")
        finally:
            checkpointed.SLICE_BYTES = before
        (_, a), = whole
        (_, b), = sliced
        self.assertEqual(a.dtype, torch.float64)
        self.assertLess((a - b).abs().max().item(), 1e-13 * a.abs().max().item())

    def test_each_stage_reuses_the_evaluations_of_the_stages_before_it(self):
        _save(self.dir)
        state = _state(self.dir)
        seen = []

        def run(upto, key):
            case = _case(state, self.ids)
            case.progress = lambda stage, phase: seen.append(stage)
            seen.clear()
            result = evaluate.forward(case, perturbations=3, upto=upto, key=key)
            return result, list(seen)

        result, calls = run("case", "k1")
        self.assertEqual(calls, ["construct", "case"])
        self.assertIsNone(result["precise"])
        case_answer = result["expected"][0][1].array
        result, calls = run("float64", "k1")
        # The float64 answer, and the case dtype under an inert mode (the float64 pass runs under
        # one); the case dtype's answer is the one kept.
        self.assertEqual(calls, ["float64", "case"])
        self.assertIsNotNone(result["precise"])
        self.assertIsNone(result["own"])
        self.assertTrue(np.array_equal(result["expected"][0][1].array, case_answer))
        result, calls = run("nudged", "k1")
        self.assertEqual(calls, ["case"] * 4)  # three nudges and the confirmation after them
        self.assertIsNotNone(result["own"])
        # Another case makes its own evaluations.
        _, calls = run("float64", "k2")
        self.assertEqual(calls, ["case", "float64", "case"])

    def test_each_modules_mapped_pages_go_back_after_its_forward(self):
        values = dict(VALUES, vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2)
        _save(self.dir, values=values)
        state = _state(self.dir)
        path = os.path.join(self.dir, "model.safetensors")
        size = os.path.getsize(path)
        case = _case(state, self.ids, values=values)
        module = evaluate.build_module(case)
        peaks = []
        hooks = [layer.register_forward_hook(lambda *_: peaks.append(_resident(path)))
                 for layer in module.model.layers]
        try:
            evaluate._evaluate_once(case, module, case.args, "f32")
            after_case = _resident(path)
            evaluate._evaluate64(case, module, case.args, "f64")
        finally:
            for hook in hooks:
                hook.remove()
        # One layer's weights (a sixth of the layers' bytes) and the embedding at most, never the
        # checkpoint: each module's pages go back once it has run.
        self.assertGreater(max(peaks), 0)
        self.assertLess(max(peaks), size / 3, peaks)
        self.assertLess(after_case, size / 8)
        self.assertLess(_resident(path), size / 8)


if __name__ == "__main__":
    unittest.main()
