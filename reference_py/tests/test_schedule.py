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


def _llama_config(**overrides):
    from transformers import LlamaConfig

    values = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=32)
    values.update(overrides)
    return LlamaConfig, values


class RunningSum(torch.nn.Module if torch else object):
    """A plain module with state of its own: each call adds its input's sum over positions."""

    def __init__(self):
        super().__init__()
        self.total = None

    def forward(self, x):
        step = x.cumsum(1)
        if self.total is not None:
            step = step + self.total
        self.total = step[:, -1:]
        return step


class Stateless(torch.nn.Module if torch else object):
    def forward(self, x):
        return x.cumsum(1)


class ReusedBuffer(torch.nn.Module if torch else object):
    """A plain module that returns one buffer, written again at each call (the running sum)."""

    def __init__(self):
        super().__init__()
        self.buffer = None

    def forward(self, x):
        step = x.cumsum(1)
        if self.buffer is None or self.buffer.shape != step.shape:
            self.buffer = step
        else:
            self.buffer.copy_(self.buffer[:, -1:] + step)
        return self.buffer


def doubling_in_place(x, step):
    """A step function that writes its next state over its input and returns it."""
    return x.mul_(2)


@unittest.skipIf(torch is None or transformers is None, "needs torch and transformers")
class ScheduleTest(unittest.TestCase):
    def setUp(self):
        from golden_ref.backends import TorchBackend

        self.backend = TorchBackend()
        self.rng = np.random.default_rng(0)

    def case(self, obj, args, config=None, chunks=None, generate=0, mask=None, init=None):
        from golden_ref.evaluate import Case
        from golden_ref.schedule import Plan
        from golden_ref.wire import WireTensor

        wired = []
        for a in args:
            a = np.asarray(a)
            wired.append(WireTensor("i64" if a.dtype.kind == "i" else "f32", a))
        case = Case(obj, "module", self.backend, wired, {}, init or {}, 7, "f32")
        if config is not None:
            case.config = config
        if chunks is not None:
            mask_wire = None if mask is None else WireTensor("i64", np.asarray(mask, dtype=np.int64))
            case.schedule = Plan({"arg": 0, "axis": 1, "chunks": chunks, "generate": generate}, mask_wire)
        return case

    def ids(self, b, n, vocab=32):
        return self.rng.integers(0, vocab, size=(b, n)).astype(np.int64)

    def leaves(self, result, key="expected"):
        return {name: t.array for name, t in result[key]}

    def test_every_step_agrees_with_the_one_shot_forward_at_its_positions(self):
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward

        case = self.case(LlamaForCausalLM, [self.ids(2, 7)], _llama_config(), chunks=[3, 1, 2, 1])
        result = forward(case)
        out = self.leaves(result)
        self.assertEqual(out["step.0.out.logits"].shape, (2, 3, 32))
        self.assertEqual(out["step.2.out.logits"].shape, (2, 2, 32))
        for k in range(4):
            np.testing.assert_allclose(out[f"step.{k}.out.logits"], out[f"oneshot.{k}.out.logits"], atol=1e-5)
        precise = self.leaves(result, "precise")
        for k in range(4):
            np.testing.assert_allclose(precise[f"step.{k}.out.logits"], precise[f"oneshot.{k}.out.logits"],
                                       atol=1e-12)

    def test_a_padded_batch_is_compared_on_valid_positions_only(self):
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward

        mask = np.ones((2, 6), dtype=np.int64)
        mask[1, :2] = 0  # left padding
        ids = self.ids(2, 6)
        result = forward(self.case(LlamaForCausalLM, [ids], _llama_config(), chunks=[4, 1, 1], mask=mask))
        out = self.leaves(result)
        self.assertTrue((out["step.0.out.logits"][1, :2] == 0).all())
        self.assertTrue((out["step.0.out.logits"][1, 2:] != 0).any())
        # The padded row's valid positions give what the row alone gives.
        alone = forward(self.case(LlamaForCausalLM, [ids[1:, 2:]], _llama_config(), chunks=[2, 1, 1]))
        alone = self.leaves(alone)
        np.testing.assert_allclose(out["step.0.out.logits"][1, 2:], alone["step.0.out.logits"][0], atol=1e-5)
        np.testing.assert_allclose(out["step.2.out.logits"][1], alone["step.2.out.logits"][0], atol=1e-5)

    def test_the_padding_ignored_mistake_runs_the_padded_rows_as_if_their_padding_were_tokens(self):
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward

        mask = np.ones((2, 5), dtype=np.int64)
        mask[1, :2] = 0  # left padding
        ids = self.ids(2, 5)
        case = self.case(LlamaForCausalLM, [ids], _llama_config(), chunks=[3, 1, 1], mask=mask)
        case.schedule.mistake = "padding-ignored"
        ignored = self.leaves(forward(case, precise=False))
        unpadded = self.leaves(forward(self.case(LlamaForCausalLM, [ids], _llama_config(), chunks=[3, 1, 1]),
                                       precise=False))
        # The valid positions are what the batch gives unpadded (padded positions are zeros).
        np.testing.assert_allclose(ignored["step.0.out.logits"][1, 2:], unpadded["step.0.out.logits"][1, 2:],
                                   atol=1e-6)
        for k in (1, 2):
            np.testing.assert_allclose(ignored[f"step.{k}.out.logits"], unpadded[f"step.{k}.out.logits"], atol=1e-6)
        # And not what the padded batch gives.
        case = self.case(LlamaForCausalLM, [ids], _llama_config(), chunks=[3, 1, 1], mask=mask)
        padded = self.leaves(forward(case, precise=False))
        self.assertGreater(np.abs(padded["step.2.out.logits"][1] - ignored["step.2.out.logits"][1]).max(), 1e-4)

    def test_generation_keeps_the_first_evaluations_tokens(self):
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward

        case = self.case(LlamaForCausalLM, [self.ids(2, 4)], _llama_config(), chunks=[4], generate=3)
        result = forward(case)
        out = self.leaves(result)
        tokens = out["tokens"]
        self.assertEqual(tokens.shape, (2, 3))
        # Greedy: each token is the argmax of the logits at the position before it.
        self.assertTrue((out["step.0.out.logits"][:, -1].argmax(-1) == tokens[:, 0]).all())
        self.assertTrue((out["step.1.out.logits"][:, -1].argmax(-1) == tokens[:, 1]).all())
        self.assertEqual(len([n for n in out if n.startswith("step.")]), 4)
        np.testing.assert_allclose(out["step.3.out.logits"], out["oneshot.3.out.logits"], atol=1e-5)

    def test_a_submodule_gets_its_position_embeddings_and_mask_as_the_model_builds_them(self):
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel

        from golden_ref.evaluate import forward

        config_class, values = _llama_config(num_hidden_layers=1)
        model = LlamaModel(config_class(**values)).eval()
        x = self.rng.standard_normal((2, 5, 16)).astype(np.float32)
        case = self.case(LlamaDecoderLayer, [x], (config_class, values), init={"layer_idx": 0})
        case.state = [(name, self._wire(v)) for name, v in model.layers[0].state_dict().items()]
        out = self.leaves(forward(case, precise=False))
        # The same layer as the model runs it, on the same hidden states.
        with torch.no_grad():
            positions = torch.arange(5)[None].expand(2, 5)
            embeddings = model.rotary_emb(torch.from_numpy(x), positions)
            from transformers.masking_utils import create_causal_mask

            mask = create_causal_mask(config=model.config, inputs_embeds=torch.from_numpy(x), attention_mask=None,
                                      past_key_values=None, position_ids=positions)
            want = model.layers[0](torch.from_numpy(x), attention_mask=mask, position_embeddings=embeddings)
        np.testing.assert_allclose(out["out"], want.numpy(), atol=1e-6)

    def _wire(self, value):
        from golden_ref.wire import WireTensor

        return WireTensor("f32", value.detach().numpy().astype(np.float32))

    def test_a_plain_module_keeps_its_own_state_between_steps(self):
        from golden_ref.evaluate import forward

        x = self.rng.standard_normal((1, 5, 2)).astype(np.float32)
        out = self.leaves(forward(self.case(RunningSum, [x], chunks=[2, 1, 2]), precise=False))
        for k in range(3):
            np.testing.assert_allclose(out[f"step.{k}.out"], out[f"oneshot.{k}.out"], atol=1e-6)
        # A module without state gives chunks that differ from the one-shot run.
        out = self.leaves(forward(self.case(Stateless, [x], chunks=[2, 3]), precise=False))
        self.assertGreater(np.abs(out["step.1.out"] - out["oneshot.1.out"]).max(), 1e-3)

    def test_what_a_step_returned_is_kept_whatever_the_next_step_writes(self):
        from golden_ref.evaluate import Case, forward
        from golden_ref.schedule import Plan
        from golden_ref.wire import WireTensor

        # A loop whose step function doubles its carried input in place.
        x = np.array([[1.0, -2.0]], dtype=np.float32)
        case = Case(doubling_in_place, "function", self.backend, [WireTensor("f32", x)], {}, {}, 7, "f32")
        case.schedule = Plan({"arg": 0, "axis": 0, "chunks": [1, 1, 1],
                              "loop": {"per_step": [], "carry": [[0, "out"]]}})
        out = self.leaves(forward(case, precise=False))
        for k in range(3):
            np.testing.assert_array_equal(out[f"step.{k}.out"], x * 2 ** (k + 1))
        # A module that returns the buffer it writes again at its next call.
        x = np.array([[[1.0], [2.0], [3.0]]], dtype=np.float32)
        out = self.leaves(forward(self.case(ReusedBuffer, [x], chunks=[1, 1, 1]), precise=False))
        for k, total in enumerate([1.0, 3.0, 6.0]):
            np.testing.assert_array_equal(out[f"step.{k}.out"], [[[total]]])

    def test_a_model_s_cache_in_its_outputs_is_state_not_a_leaf(self):
        # A plain forward of a causal LM returns its `past_key_values` beside the logits.
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward

        case = self.case(LlamaForCausalLM, [self.ids(1, 3)], _llama_config())
        out = self.leaves(forward(case, precise=False))
        self.assertEqual(list(out), ["out.logits"])

    def test_a_schedule_past_max_position_embeddings_is_refused_before_any_step(self):
        from transformers import LlamaForCausalLM

        from golden_ref.evaluate import forward
        from golden_ref.schedule import ScheduleError

        case = self.case(LlamaForCausalLM, [self.ids(1, 30)], _llama_config(), chunks=[29, 1], generate=4)
        with self.assertRaisesRegex(ScheduleError, r"position 33, beyond the module's max_position_embeddings \(32\)"):
            forward(case)

    def test_a_transformers_module_without_a_cache_is_refused(self):
        from transformers.models.llama.modeling_llama import LlamaMLP

        from golden_ref.evaluate import forward
        from golden_ref.schedule import ScheduleError

        x = self.rng.standard_normal((1, 4, 16)).astype(np.float32)
        case = self.case(LlamaMLP, [x], _llama_config(), chunks=[2, 1, 1])
        with self.assertRaisesRegex(ScheduleError, "takes no `past_key_values`"):
            forward(case)


if __name__ == "__main__":
    unittest.main()
