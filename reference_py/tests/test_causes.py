"""The diagnosis names configuration mistakes and structural rewrites, on the kinds of check a
transformers model is checked with: a submodule driven with what its model builds (position
embeddings, a mask), a decoder layer, a whole model. Each port here is the reference's own
computation with one porting mistake written out in torch (or, for a configuration mistake, the
reference built from the mistaken configuration), and the search must name that mistake, with
where the reference makes the choice.
"""

import unittest

import numpy as np

try:
    import torch
    import transformers
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None

HIDDEN, HEADS = 32, 2
HEAD = HIDDEN // HEADS
CONFIG = dict(vocab_size=32, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=HEADS, max_position_embeddings=64, rotary_pct=0.25,
              use_parallel_residual=True)


@unittest.skipIf(torch is None, "needs torch and transformers")
class CausesTest(unittest.TestCase):
    def setUp(self):
        from golden_ref.backends import TorchBackend

        self.backend = TorchBackend()
        self.rng = np.random.default_rng(1)

    def wire(self, a, dtype="f32"):
        from golden_ref.wire import WireTensor

        return WireTensor(dtype, np.ascontiguousarray(a))

    def case(self, cls, args, config, init=None):
        """A module-form case of a GPT-NeoX class from `config`, with weights drawn here (norm
        weights near one)."""
        from golden_ref.evaluate import Case, build_module

        case = Case(cls, "module", self.backend, args, {}, init or {}, 3, "f32")
        case.config = (transformers.GPTNeoXConfig, dict(config))
        generator = torch.Generator().manual_seed(0)
        state = []
        for name, t in build_module(case).state_dict().items():
            value = torch.randn(t.shape, generator=generator) * 0.3
            if "norm" in name and name.endswith("weight"):
                value += 1.0
            state.append((name, self.wire(value.numpy())))
        case.state = state
        return case

    def outputs(self, case, config=None):
        """The case's outputs, or those of the reference built from `config` on the same weights."""
        from golden_ref.evaluate import forward

        if config is not None:
            other = case.derived(case.obj)
            other.config = (case.config[0], dict(config))
            case = other
        return forward(case.derived(case.obj), precise=False)["expected"]

    def named(self, case, port, names):
        """The mutants the port matches within a float32 tolerance, as (kind, what, where)."""
        from golden_ref import mutations

        _, found = mutations.search(case, port, names, budget=60)
        port = dict(port)
        out = []
        for candidate, result in found:
            fits = True
            for name, t in result["expected"]:
                a, b = np.asarray(t.array, np.float64), np.asarray(port[name].array, np.float64)
                fits &= a.shape == b.shape and bool((np.abs(a - b) <= 2e-5 + 1e-4 * np.abs(a)).all())
            if fits:
                out.append((candidate.kind, candidate.what, candidate.where))
        return out

    def attention(self, implementation):
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

        x = self.rng.standard_normal((2, 5, HIDDEN)).astype(np.float32)
        config = {**CONFIG, "attn_implementation": implementation}
        return self.case(GPTNeoXAttention, [self.wire(x)], config, {"layer_idx": 0}), x

    def attention_port(self, case, x, mistake):
        """GPT-NeoX's attention written out, as a port of it would be, with one `mistake`."""
        w = {name: torch.tensor(t.array) for name, t in case.state}
        b, t = x.shape[:2]
        rotary = HEAD if mistake == "whole head rotated" else HEAD // 4
        qkv = torch.tensor(x) @ w["query_key_value.weight"].T + w["query_key_value.bias"]
        if mistake == "split per tensor":
            q, k, v = (a.view(b, t, HEADS, HEAD).transpose(1, 2) for a in qkv.chunk(3, -1))
        else:
            q, k, v = qkv.view(b, t, HEADS, 3 * HEAD).transpose(1, 2).chunk(3, -1)
        freqs = torch.arange(t).float()[:, None] / 10000 ** (torch.arange(0, rotary, 2).float() / rotary)
        interleaved = mistake == "interleaved pairs"
        angles = torch.repeat_interleave(freqs, 2, -1) if interleaved else torch.cat([freqs, freqs], -1)

        def rope(a):
            r, rest = a[..., :rotary], a[..., rotary:]
            if interleaved:
                turned = torch.stack([-r[..., 1::2], r[..., 0::2]], -1).flatten(-2)
            else:
                turned = torch.cat([-r[..., rotary // 2:], r[..., :rotary // 2]], -1)
            return torch.cat([r * angles.cos() + turned * angles.sin(), rest], -1)

        scale = 1 / HEAD if mistake == "scale 1/d" else HEAD ** -0.5
        scores = rope(q) @ rope(k).transpose(-1, -2) * scale
        diagonal = 1 if mistake == "mask one further" else 0
        allowed = torch.ones(t, t).tril(diagonal).bool()
        probs = scores.masked_fill(~allowed, torch.finfo(torch.float32).min).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(b, t, HIDDEN) @ w["dense.weight"].T + w["dense.bias"]
        leaves = [("out.0", self.wire(out.numpy())), ("out.1", self.wire(probs.numpy()))]
        return leaves[:len(self.outputs(case))]

    def test_the_right_attention_port_is_the_reference(self):
        for implementation in ("eager", "sdpa"):
            case, x = self.attention(implementation)
            for (name, a), (_, b) in zip(self.attention_port(case, x, None), self.outputs(case)):
                np.testing.assert_allclose(a.array, b.array, atol=2e-6, err_msg=f"{implementation} {name}")

    def test_a_driven_submodule_is_mutated_as_it_is_driven(self):
        # The attention module takes the position embeddings and the mask its model builds: every
        # mutant must be run with them, or none of them answers (the cheap pass called it bare).
        for implementation, words in (("eager", "Tensor.mul by 0.0625"),
                                      ("sdpa", "F.scaled_dot_product_attention(scale=1/d)")):
            case, x = self.attention(implementation)
            found = self.named(case, self.attention_port(case, x, "scale 1/d"), ["hidden_states"])
            self.assertTrue(any(words in what for _, what, _ in found), f"{implementation}: {found}")

    def test_a_fused_projection_split_per_tensor(self):
        case, x = self.attention("sdpa")
        found = self.named(case, self.attention_port(case, x, "split per tensor"), ["hidden_states"])
        self.assertTrue(found, "nothing named")
        kind, what, where = found[0]
        self.assertEqual(kind, "structure")
        self.assertIn("fused projection split per tensor ([3, 2, 16]", what)
        self.assertIn("transformers/models/gpt_neox/modeling_gpt_neox.py:", where)

    def test_rotary_on_interleaved_pairs_with_tables_the_driving_builds(self):
        case, x = self.attention("eager")
        found = self.named(case, self.attention_port(case, x, "interleaved pairs"), ["hidden_states"])
        self.assertTrue(any("interleaved pairs" in what for _, what, _ in found), found)

    def test_a_causal_mask_one_diagonal_off(self):
        # Under sdpa too: transformers' mask is built (not left to the kernel's `is_causal`) while
        # the diagnosis runs, so the rule is one comparison in every step.
        for implementation, words in (("eager", "`kv_idx <= q_idx` with its right side + 1"),
                                      ("sdpa", "`kv_idx <= q_idx` with its right side + 1")):
            case, x = self.attention(implementation)
            found = self.named(case, self.attention_port(case, x, "mask one further"), ["hidden_states"])
            self.assertTrue(any(words in what for _, what, _ in found), f"{implementation}: {found}")

    def test_the_partial_rotary_fraction_ignored_is_a_configuration_mistake(self):
        case, x = self.attention("sdpa")
        found = self.named(case, self.attention_port(case, x, "whole head rotated"), ["hidden_states"])
        self.assertTrue(found, "nothing named")
        kind, what, where = found[0]
        self.assertEqual(kind, "config")
        self.assertEqual(what, "`rope_parameters['partial_rotary_factor']` were 1.0")
        self.assertIn("transformers/models/gpt_neox/modeling_gpt_neox.py:", where)

    def test_configuration_mistakes_of_a_layer_and_of_a_whole_model(self):
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer

        x = self.rng.standard_normal((2, 5, HIDDEN)).astype(np.float32)
        ids = np.array([[1, 5, 7, 3, 9], [2, 4, 6, 8, 1]], dtype=np.int64)
        checks = (
            (GPTNeoXLayer, [self.wire(x)], {"layer_idx": 0}, ["hidden_states"]),
            (transformers.GPTNeoXForCausalLM, [self.wire(ids, "i64")], {}, ["input_ids"]),
        )
        mistakes = (("use_parallel_residual", False, "`use_parallel_residual` were False"),
                    ("hidden_act", "gelu_pytorch_tanh", "`hidden_act` were 'gelu_pytorch_tanh'"),
                    ("layer_norm_eps", 1e-6, "`layer_norm_eps` were 1e-6"))
        for cls, args, init, names in checks:
            case = self.case(cls, args, {**CONFIG, "attn_implementation": "sdpa"}, init)
            for field, value, words in mistakes:
                port = self.outputs(case, {**CONFIG, "attn_implementation": "sdpa", field: value})
                found = self.named(case, port, names)
                self.assertTrue(found, f"{cls.__name__} {field}: nothing named")
                kind, what, where = found[0]
                self.assertEqual((kind, what), ("config", words), f"{cls.__name__}: {found}")
                self.assertIn("transformers/models/gpt_neox/", where)

    def test_a_right_port_is_matched_by_no_mutant(self):
        from golden_ref import mutations

        case, x = self.attention("sdpa")
        _, found = mutations.search(case, self.attention_port(case, x, None), ["hidden_states"], budget=60)
        self.assertEqual(found, [])

    def test_the_fields_read_and_where(self):
        from golden_ref import mutations
        from golden_ref.evaluate import forward

        case, _ = self.attention("eager")
        recording = mutations.Recording(mutations.catalogue_for(case.obj))
        forward(mutations._wrapped(case, recording.session), precise=False)
        fields = recording.reads.fields
        # Read by the module, and by the rotary embedding the driving builds from the configuration.
        self.assertIn(("rope_parameters", "partial_rotary_factor"), fields)
        self.assertIn(("rope_parameters", "rope_theta"), fields)
        self.assertTrue(fields[("attention_bias",)].places[0].startswith(
            "transformers/models/gpt_neox/modeling_gpt_neox.py:"))
        # Fields that say nothing about the computation are not watched.
        self.assertNotIn(("use_cache",), fields)


if __name__ == "__main__":
    unittest.main()


@unittest.skipIf(torch is None, "needs torch and transformers")
class BranchesTest(unittest.TestCase):
    """Two residual branches in parallel where the reference runs them in sequence (a Llama decoder
    layer ported GPT-J's way): a structural rewrite of the submodule calls, named without any
    configuration switch to flip."""

    def test_a_sequential_block_ported_in_parallel(self):
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case, build_module, forward
        from golden_ref.wire import WireTensor
        from transformers.models.llama import modeling_llama

        config = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32)
        case = Case(modeling_llama.LlamaDecoderLayer, "module", TorchBackend(), [WireTensor("f32", x)], {},
                    {"layer_idx": 0}, 3, "f32")
        case.config = (transformers.LlamaConfig, config)
        generator = torch.Generator().manual_seed(0)
        case.state = [(name, WireTensor("f32", (torch.randn(t.shape, generator=generator) * 0.3
                                                + (1.0 if "norm" in name else 0.0)).numpy()))
                      for name, t in build_module(case).state_dict().items()]

        def parallel(layer, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                     use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
            attention, _ = layer.self_attn(
                hidden_states=layer.input_layernorm(hidden_states), attention_mask=attention_mask,
                position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
                cache_position=cache_position, position_embeddings=position_embeddings, **kwargs)
            return hidden_states + attention + layer.mlp(layer.post_attention_layernorm(hidden_states))

        right = modeling_llama.LlamaDecoderLayer.forward
        modeling_llama.LlamaDecoderLayer.forward = parallel
        try:
            port = forward(case.derived(case.obj), precise=False)["expected"]
        finally:
            modeling_llama.LlamaDecoderLayer.forward = right
        _, found = mutations.search(case, port, ["hidden_states"], budget=60)
        expected = dict(port)
        fits = [c for c, result in found
                if all(np.allclose(t.array, expected[n].array, rtol=1e-4, atol=2e-5) for n, t in result["expected"])]
        self.assertTrue(fits, "nothing named")
        self.assertEqual(fits[0].kind, "structure")
        self.assertIn("two branches in parallel where the reference runs them in sequence", fits[0].what)
        self.assertIn("transformers/models/llama/modeling_llama.py:", fits[0].where)


def causal_attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@unittest.skipIf(torch is None, "needs torch")
class KernelMaskTest(unittest.TestCase):
    def test_a_kernel_s_causal_mask_one_diagonal_further(self):
        # A reference that leaves its mask to the kernel (`is_causal=True`): the mask's diagonal
        # is moved by writing the mask out.
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        rng = np.random.default_rng(2)
        q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
        case = Case(causal_attention, "function", TorchBackend(), [WireTensor("f32", a) for a in (q, k, v)], {},
                    {}, 3, "f32")
        mask = torch.ones(5, 5, dtype=torch.bool).tril(1)
        port = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a) for a in (q, k, v)), attn_mask=mask).numpy()
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], ["q", "k", "v"], budget=30)
        fits = [c.what for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=2e-6)]
        self.assertTrue(any("causal mask's diagonal one further" in w for w in fits), fits)


def batch_norm_eval(x, mean, var, weight, bias):
    return torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=False, eps=1e-5)


def unscaled_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def gated_half(x):
    half = x.shape[-1] // 2
    return torch.cat([torch.nn.functional.silu(x[..., :half]), x[..., half:]], dim=-1)


@unittest.skipIf(torch is None, "needs torch")
class GenericRewritesTest(unittest.TestCase):
    """Families that apply to any reference: a call's switch the other way, a scale before a
    softmax the reference does not have, an op on the whole of an axis the reference splits."""

    def named(self, fn, arrays, port, sizes=()):
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        case = Case(fn, "function", TorchBackend(), [WireTensor("f32", a) for a in arrays], {}, {}, 3, "f32")
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], None, budget=30, sizes=sizes)
        return [c.what for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=3e-6, rtol=1e-5)]

    def test_a_batch_norm_with_the_batch_s_statistics(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((6, 4)).astype(np.float32) * 2 + 1
        mean, var = rng.standard_normal(4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
        w, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        t = [torch.tensor(a) for a in (x, mean, var, w, b)]
        port = torch.nn.functional.batch_norm(t[0], None, None, t[3], t[4], training=True, eps=1e-5).numpy()
        found = self.named(batch_norm_eval, [x, mean, var, w, b], port)
        self.assertIn("F.batch_norm(training=True)", found)

    def test_scores_scaled_where_the_reference_does_not_scale_them(self):
        rng = np.random.default_rng(4)
        q, k, v = (rng.standard_normal((2, 5, 16)).astype(np.float32) for _ in range(3))
        t = [torch.tensor(a) for a in (q, k, v)]
        port = (torch.softmax(t[0] @ t[1].transpose(-1, -2) / 4.0, dim=-1) @ t[2]).numpy()
        found = self.named(unscaled_attention, [q, k, v], port, sizes=[("d", 16)])
        self.assertTrue(any("scaled by 0.25 = 1/√d" in w for w in found), found)

    def test_an_op_on_the_whole_axis_where_the_reference_takes_half(self):
        x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
        port = torch.nn.functional.silu(torch.tensor(x)).numpy()
        found = self.named(gated_half, [x], port)
        self.assertTrue(any("applied to the whole of the last axis instead of its first 4 of 8" in w
                            for w in found), found)


def _rotate_interleaved(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def rope_interleaved(x, positions):
    """Rotary embeddings on neighbouring pairs, as Cohere and GPT-J write them."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = positions[:, None].float() * inv[None]
    emb = torch.repeat_interleave(freqs, 2, dim=-1)
    return x * emb.cos() + _rotate_interleaved(x) * emb.sin()


@unittest.skipIf(torch is None, "needs torch")
class PairingTest(unittest.TestCase):
    def test_rotary_on_halves_where_the_reference_pairs_neighbours(self):
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        x = np.random.default_rng(6).standard_normal((2, 5, 8)).astype(np.float32)
        positions = np.arange(5, dtype=np.float32)
        tx = torch.tensor(x)
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
        emb = torch.cat([torch.arange(5).float()[:, None] * inv[None]] * 2, dim=-1)
        port = (tx * emb.cos() + torch.cat([-tx[..., 4:], tx[..., :4]], dim=-1) * emb.sin()).numpy()
        case = Case(rope_interleaved, "function", TorchBackend(),
                    [WireTensor("f32", x), WireTensor("f32", positions)], {}, {}, 3, "f32")
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], ["x", "positions"], budget=30)
        fits = [c.what for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=2e-6)]
        self.assertIn("rotary embeddings on the two halves (rotate_half, rope) instead of interleaved pairs", fits)


def grouped_attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@unittest.skipIf(torch is None, "needs torch")
class GroupedHeadsTest(unittest.TestCase):
    def test_key_value_heads_tiled_where_the_kernel_groups_them(self):
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        rng = np.random.default_rng(7)
        q = rng.standard_normal((1, 4, 3, 8)).astype(np.float32)
        k, v = (rng.standard_normal((1, 2, 3, 8)).astype(np.float32) for _ in range(2))
        tq, tk, tv = (torch.tensor(a) for a in (q, k, v))
        port = torch.nn.functional.scaled_dot_product_attention(tq, tk.repeat(1, 2, 1, 1), tv.repeat(1, 2, 1, 1)).numpy()
        case = Case(grouped_attention, "function", TorchBackend(), [WireTensor("f32", a) for a in (q, k, v)],
                    {}, {}, 3, "f32")
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], ["q", "k", "v"], budget=30)
        fits = [c.what for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=2e-6)]
        self.assertTrue(any("key/value heads tiled to the query heads" in w for w in fits), fits)


def centered_norm(x, weight):
    """A layer norm written out, without a bias (as Cohere's)."""
    mean = x.mean(-1, keepdim=True)
    variance = (x - mean).pow(2).mean(-1, keepdim=True)
    return weight * ((x - mean) * torch.rsqrt(variance + 1e-5))


def rms_norm_by_hand(x, weight):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def layer_norm_function(x, weight, bias):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


@unittest.skipIf(torch is None, "needs torch")
class NormKindTest(unittest.TestCase):
    def fits(self, fn, arrays, port):
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        case = Case(fn, "function", TorchBackend(), [WireTensor("f32", a) for a in arrays], {}, {}, 3, "f32")
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], None, budget=30)
        return [c.what for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=3e-6, rtol=1e-5)]

    def test_a_layer_norm_written_out_ported_without_its_mean(self):
        rng = np.random.default_rng(8)
        x = (rng.standard_normal((3, 8)) + 2).astype(np.float32)
        w = rng.standard_normal(8).astype(np.float32)
        tx, tw = torch.tensor(x), torch.tensor(w)
        port = (tw * (tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-5))).numpy()  # an RMS norm
        found = self.fits(centered_norm, [x, w], port)
        self.assertTrue(any("of the mean left out" in f for f in found), found)

    def test_a_layer_norm_ported_as_an_rms_norm(self):
        rng = np.random.default_rng(9)
        x = (rng.standard_normal((3, 8)) + 2).astype(np.float32)
        w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        tx = torch.tensor(x)
        port = (tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.tensor(w) + torch.tensor(b)).numpy()
        found = self.fits(layer_norm_function, [x, w, b], port)
        self.assertIn("an RMS norm (no mean subtracted) in place of F.layer_norm", found)


if transformers is not None if torch is not None else False:
    class SwitchConfig(transformers.PreTrainedConfig):
        """A configuration with a switch that adds a module (and its weights)."""

        model_type = "golden_switch"

        def __init__(self, hidden=8, final_norm=True, **kwargs):
            self.hidden = hidden
            self.final_norm = final_norm
            super().__init__(**kwargs)

    class SwitchModel(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.proj = torch.nn.Linear(config.hidden, config.hidden)
            self.norm = torch.nn.LayerNorm(config.hidden) if config.final_norm else None

        def forward(self, x):
            x = self.proj(x)
            return self.norm(x) if self.config.final_norm else x


@unittest.skipIf(torch is None, "needs torch and transformers")
class SwitchedModuleTest(unittest.TestCase):
    def test_a_switch_that_removes_a_module_is_tried_on_the_weights_left(self):
        # The port has no final norm: the reference built with `final_norm=False` has fewer
        # weights than the case, and is tried with those it has.
        from golden_ref import mutations
        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case
        from golden_ref.wire import WireTensor

        rng = np.random.default_rng(10)
        x = rng.standard_normal((2, 8)).astype(np.float32)
        w, b = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        g, beta = (rng.standard_normal(8) + 1).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        case = Case(SwitchModel, "module", TorchBackend(), [WireTensor("f32", x)], {}, {}, 3, "f32")
        case.config = (SwitchConfig, {"hidden": 8})
        case.state = [("proj.weight", WireTensor("f32", w)), ("proj.bias", WireTensor("f32", b)),
                      ("norm.weight", WireTensor("f32", g)), ("norm.bias", WireTensor("f32", beta))]
        port = (x @ w.T + b).astype(np.float32)
        _, found = mutations.search(case, [("out", WireTensor("f32", port))], ["x"], budget=30)
        fits = [(c.kind, c.what) for c, r in found if np.allclose(r["expected"][0][1].array, port, atol=2e-6)]
        self.assertIn(("config", "`final_norm` were False"), fits)
