import unittest

import numpy as np

from golden_ref.backends import NumpyBackend, bf16_bits_to_f32, f32_to_bf16_bits, flatten_outputs
from golden_ref.evaluate import nudge
from golden_ref.wire import WireTensor


class NudgeTest(unittest.TestCase):
    def test_moves_every_finite_nonzero_value_by_one_ulp(self):
        x = np.array([1.0, -2.5, 3e-40, 1e30, 0.0, np.inf, np.nan], dtype=np.float32)
        moved = nudge(WireTensor("f32", x), np.random.default_rng(0)).array
        for before, after in zip(x[:4], moved[:4]):
            self.assertNotEqual(before, after)
            self.assertTrue(after in (np.nextafter(before, np.inf), np.nextafter(before, -np.inf)))
        self.assertEqual(moved[4], 0.0)
        self.assertEqual(moved[5], np.inf)
        self.assertTrue(np.isnan(moved[6]))

    def test_bf16_moves_by_one_bf16_ulp(self):
        bits = f32_to_bf16_bits(np.array([1.0, -3.0], dtype=np.float32))
        moved = bf16_bits_to_f32(nudge(WireTensor("bf16", bits), np.random.default_rng(1)).array)
        ulps = np.abs(moved - np.array([1.0, -3.0])) / np.array([2.0**-7, 2.0**-6])
        np.testing.assert_allclose(ulps, [1, 1], atol=0.51)

    def test_integers_are_left_alone(self):
        ids = WireTensor("i64", np.arange(5))
        self.assertIs(nudge(ids, np.random.default_rng(0)), ids)


class SameArrayTest(unittest.TestCase):
    def test_compares_bits_a_chunk_at_a_time(self):
        from golden_ref import evaluate

        x = np.zeros(3 * evaluate._CHUNK // 4 + 5, dtype=np.float32)
        self.assertTrue(evaluate._same_array(x, x.copy()))
        for where in (0, evaluate._CHUNK // 4, x.size - 1):  # in the first, a middle, the last chunk
            y = x.copy()
            y[where] = 1.0
            self.assertFalse(evaluate._same_array(x, y))
        nan = np.array([np.nan, 0.0], dtype=np.float32)
        self.assertTrue(evaluate._same_array(nan, nan.copy()))  # the same bits, not equal values
        self.assertFalse(evaluate._same_array(nan[1:], -nan[1:]))  # 0.0 and -0.0
        self.assertFalse(evaluate._same_array(x[:4], x[:4].reshape(2, 2)))
        bits = np.array([1, 2], dtype=np.uint16)
        self.assertTrue(evaluate._same_array(bits, bits.copy()))


class Bf16Test(unittest.TestCase):
    def test_rounds_to_nearest_even(self):
        # 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to the even mantissa, 1.0.
        halfway = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8], dtype=np.float32)
        back = bf16_bits_to_f32(f32_to_bf16_bits(halfway))
        np.testing.assert_array_equal(back, [1.0, 1 + 2.0**-6])


class FlattenTest(unittest.TestCase):
    def test_names_leaves_like_the_runtime(self):
        a = np.zeros(2)
        names = [n for n, _ in flatten_outputs((a, {"k": a, "v": [a, None]}), NumpyBackend())]
        self.assertEqual(names, ["out.0", "out.1.k", "out.1.v.0"])


if __name__ == "__main__":
    unittest.main()


def _torch_case(fn, args, form="function", init=None, dtype="f32"):
    import torch  # noqa: F401 - the torch backend imports it itself; fail early here if missing

    from golden_ref.backends import TorchBackend
    from golden_ref.evaluate import Case

    wire = [WireTensor(dtype, np.asarray(a, dtype=np.float32)) for a in args]
    return Case(fn, form, TorchBackend(), wire, {}, init or {}, 7, dtype)


class EvaluateTest(unittest.TestCase):
    def test_a_bf16_checkpoint_checked_in_f32_is_nudged_by_a_float32_ulp(self):
        # A whole model's nudges are set in the case dtype: a bf16 parameter nudged by one of its
        # own ulps (256 float32 ulps) made the rounding estimate a bf16 one, which hid wrong ports.
        import torch

        from golden_ref.backends import TorchBackend
        from golden_ref.evaluate import Case, _nudge_in_place

        module = torch.nn.LayerNorm(64).to(torch.bfloat16)
        before = module.weight.detach().to(torch.float32).clone()
        case = Case(type(module), "module", TorchBackend(), [], {}, {}, 7, "f32")
        swapped = _nudge_in_place(case, module, np.random.default_rng(0))
        moved = module.weight.detach()
        self.assertEqual(moved.dtype, torch.float32)
        ulps = ((moved - before).abs() / torch.finfo(torch.float32).eps).max().item()
        self.assertGreater(ulps, 0.0)
        self.assertLessEqual(ulps, 1.0)  # one float32 ulp of values in [1, 2): eps
        for parameter, value in swapped:
            parameter.data = value
        self.assertEqual(module.weight.dtype, torch.bfloat16)

    def test_a_gradient_along_a_direction_is_its_inner_product_with_it(self):
        # A layer at size: each target's gradient comes back as one number, <gradient, direction>.
        from golden_ref.evaluate import forward, gradient_case

        x = np.array([0.5, -1.0, 2.0], dtype=np.float32)
        cotangent = np.array([1.0, 2.0, -1.0], dtype=np.float32)
        u = np.array([0.6, 0.0, -0.8], dtype=np.float32)
        square = _torch_case(lambda a: a * a, [x, cotangent, u])
        case = gradient_case(square, ["x"], [0], False, {"names": ["x"], "at": 2})
        leaves = dict(forward(case)["precise"])
        # d/dx sum(x² · c) = 2·x·c, along u.
        want = float(np.dot(2 * x.astype(np.float64) * cotangent, u.astype(np.float64)))
        self.assertEqual(leaves["out.x"].array.shape, ())
        self.assertAlmostEqual(float(leaves["out.x"].array), want, places=6)
        whole = gradient_case(_torch_case(lambda a: a * a, [x, cotangent]), ["x"], [0], False)
        self.assertEqual(dict(forward(whole)["precise"])["out.x"].array.shape, (3,))

    def test_a_reference_that_modifies_its_input_gets_fresh_copies_and_is_reported(self):
        from golden_ref.evaluate import forward

        def add_one_inplace(x):
            x.add_(1.0)
            return x

        x = np.arange(4, dtype=np.float32)
        case = _torch_case(add_one_inplace, [x])
        result = forward(case)
        self.assertEqual(result["mutated"], ["input 0"])
        np.testing.assert_array_equal(result["expected"][0][1].array, x + 1)
        # The float64 run saw the original input, not the already incremented one.
        np.testing.assert_array_equal(result["precise"][0][1].array, x + 1)
        np.testing.assert_array_equal(case.args[0].array, x)

    def test_in_place_references_do_not_change_the_rounding_estimate(self):
        # The nudged evaluations hand their private copies over without copying them again: an
        # in-place reference must still estimate exactly like its out-of-place twin, inputs and
        # parameters alike, integer inputs (not nudged, copied) included.
        import torch

        from golden_ref.evaluate import forward

        def inplace(x, i):
            i.add_(1)
            return x.mul_(3.0).add_(i.to(x.dtype))

        def pure(x, i):
            return x * 3.0 + (i + 1).to(x.dtype)

        x = np.linspace(-2, 2, 64, dtype=np.float32)
        i = np.arange(64, dtype=np.int64)
        cases = [_torch_case(inplace, [x, i]), _torch_case(pure, [x, i])]
        for case in cases:
            case.args[1] = WireTensor("i64", i)
        a, b = forward(cases[0]), forward(cases[1])
        np.testing.assert_array_equal(cases[0].args[1].array, i)
        self.assertEqual(a["mutated"], ["input 0", "input 1"])
        for key in ("expected", "precise", "own", "moved"):
            for (_, s), (_, t) in zip(a[key], b[key]):
                np.testing.assert_array_equal(s.array, t.array, err_msg=key)

        class Scale(torch.nn.Module):
            def __init__(self, inplace):
                super().__init__()
                self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 64))
                self.inplace = inplace

            def forward(self, x):
                if self.inplace:
                    with torch.no_grad():
                        self.w.mul_(2.0)
                    return x * self.w
                return x * (self.w * 2.0)

        results = []
        for flag in (True, False):
            results.append(forward(_torch_case(Scale, [x], form="module", init={"inplace": flag})))
        self.assertEqual(results[0]["mutated"], ["parameter w"])
        for key in ("expected", "precise", "own", "moved"):
            for (_, s), (_, t) in zip(results[0][key], results[1][key]):
                np.testing.assert_array_equal(s.array, t.array, err_msg=key)

    def test_twice_catches_unseeded_noise_and_passes_torch_noise(self):
        import torch

        from golden_ref.evaluate import NotDeterministic, forward

        def numpy_noise(x):
            return x + torch.from_numpy(np.random.standard_normal(tuple(x.shape))).to(x.dtype)

        def torch_noise(x):
            return x + torch.randn_like(x)  # golden seeds torch per case

        case = _torch_case(numpy_noise, [np.zeros(3)])
        case.twice = True
        with self.assertRaises(NotDeterministic):
            forward(case, precise=False)
        case = _torch_case(torch_noise, [np.zeros(3)])
        case.twice = True
        forward(case, precise=False)

    def test_every_answer_is_confirmed_after_the_nudged_evaluations(self):
        from golden_ref.evaluate import NotDeterministic, forward

        calls = []

        def drifts(x):
            calls.append(1)
            return x + 0.25 * max(0, len(calls) - 2)

        # Exact for the first two calls: only the repetition after the nudges sees the drift.
        with self.assertRaises(NotDeterministic) as raised:
            forward(_torch_case(drifts, [np.linspace(-1, 1, 8, dtype=np.float32)]))
        self.assertIn("its first and its last evaluation in the case dtype", str(raised.exception))
        calls.clear()
        forward(_torch_case(drifts, [np.zeros(2, dtype=np.float32)]), precise=False)

    def test_an_answer_that_is_a_buffer_the_reference_writes_again_is_copied(self):
        import torch

        from golden_ref.evaluate import NotDeterministic, forward

        buffer = torch.zeros(4)
        calls = []

        def writes_its_buffer(x):
            calls.append(1)
            return buffer.copy_(x + len(calls))

        with self.assertRaises(NotDeterministic):
            forward(_torch_case(writes_its_buffer, [np.zeros(4, dtype=np.float32)]))

    def test_a_reference_that_computes_otherwise_under_a_mode_shows_its_shift(self):
        import torch.nn.functional as F
        from torch.overrides import _get_current_function_mode_stack

        def watched(x):
            return F.gelu(x, approximate="tanh") if _get_current_function_mode_stack() else F.gelu(x)

        x = np.linspace(-3, 3, 64, dtype=np.float32)
        result = forward_of(watched, [x])
        shift = result["mode_shift"][0][1].array
        self.assertAlmostEqual(float(shift.max()), 4.7e-4, delta=1e-4)
        # A reference that ignores modes moves by nothing: nothing is sent.
        self.assertIsNone(forward_of(F.gelu, [x])["mode_shift"])

    def test_the_float64_run_promotes_the_reference_s_own_upcasts(self):
        import torch

        def upcast(x):
            return (x.to(torch.float32) * (1.0 / 3.0)).to(x.dtype)

        result = forward_of(upcast, [np.float32([1.0])])
        self.assertEqual(result["precise"][0][1].array.dtype, np.float64)
        self.assertAlmostEqual(float(result["precise"][0][1].array[0]), 1.0 / 3.0, places=15)

    def test_param_spec_lists_entries_with_their_statistics_and_ties(self):
        import torch

        from golden_ref.evaluate import param_spec

        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(5, 3)
                self.norm = torch.nn.LayerNorm(3)
                self.bn = torch.nn.BatchNorm1d(3)
                self.head = torch.nn.Linear(3, 5, bias=False)
                self.head.weight = self.emb.weight

        spec, tensors = param_spec(_torch_case(Tied, [], form="module"))
        entries = {e["name"]: e for e in spec["entries"]}
        self.assertEqual(spec["aliases"], [["emb.weight", "head.weight"]])
        self.assertEqual(entries["norm.weight"]["std"], 0.0)
        self.assertEqual(entries["norm.weight"]["log_mean"], 0.0)  # all ones: positive
        self.assertNotIn("log_mean", entries["norm.bias"])  # zeros
        self.assertTrue(entries["bn.running_var"]["buffer"])
        self.assertFalse(entries["bn.num_batches_tracked"]["float"])
        self.assertEqual(len(tensors), 1)  # the step counter's value comes along

    def test_param_spec_sees_uninitialised_frozen_and_computed_entries(self):
        import torch

        from golden_ref.evaluate import param_spec

        class Mixed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                # What the allocator hands back may be anything: 1e38, inf, NaN.
                junk = torch.full((4, 64), float("inf"))
                del junk
                self.experts = torch.nn.Parameter(torch.empty(4, 64))
                self.frozen = torch.nn.Parameter(torch.randn(3), requires_grad=False)
                self.register_buffer("ramp", torch.linspace(0, 1, 5))
                self.register_buffer("noise", torch.randn(5))
                self.register_buffer("zeros", torch.zeros(5))
                self.linear = torch.nn.Linear(2, 2)

        spec, tensors = param_spec(_torch_case(Mixed, [], form="module"))
        entries = {e["name"]: e for e in spec["entries"]}
        self.assertTrue(entries["experts"].get("uninitialised"))
        self.assertNotIn("mean", entries["experts"])
        self.assertEqual(entries["frozen"]["kept"], "frozen")
        self.assertEqual(entries["ramp"]["kept"], "computed")
        for drawn in ("noise", "zeros", "linear.weight", "linear.bias"):
            self.assertNotIn("kept", entries[drawn], drawn)
            self.assertTrue(np.isfinite(entries[drawn]["mean"]), drawn)
        np.testing.assert_array_equal(tensors[entries["ramp"]["value"]].array, np.linspace(0, 1, 5, dtype=np.float32))

    def test_param_spec_gives_each_weight_the_fan_in_its_module_reads_it_with(self):
        import torch

        from golden_ref.evaluate import param_spec

        class Conv1D(torch.nn.Module):
            """Hugging Face's GPT-2 projection: `x @ weight`, weight [nx, nf]."""

            def __init__(self, nf, nx):
                super().__init__()
                self.nf = nf
                self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.02)

        class Wide(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 6)
                self.fc = torch.nn.Linear(6, 4)
                self.conv = torch.nn.Conv1d(6, 8, kernel_size=3, groups=2)
                self.proj = Conv1D(12, 6)
                self.experts = torch.nn.Parameter(torch.randn(2, 4, 6))

        spec, _ = param_spec(_torch_case(Wide, [], form="module"))
        fan_in = {e["name"]: e.get("fan_in") for e in spec["entries"]}
        self.assertEqual(fan_in["emb.weight"], 0)  # an embedding's rows: activations of their own
        self.assertEqual(fan_in["fc.weight"], 6)
        self.assertEqual(fan_in["conv.weight"], 9)  # 6 input channels in 2 groups, kernel 3
        self.assertEqual(fan_in["proj.weight"], 6)  # x @ weight: its first dimension
        self.assertIsNone(fan_in["experts"])  # no module says: the runtime takes the last axis
        self.assertIsNone(fan_in["fc.bias"])

    def test_a_header_with_nan_is_still_json(self):
        import json

        from golden_ref import wire

        text = wire.header_json({"losses": [1.0, float("nan"), float("inf"), -float("inf")]})
        self.assertEqual(json.loads(text)["losses"], [1.0, "NaN", "Infinity", "-Infinity"])

    def test_a_half_precision_module_keeps_the_buffers_it_computes_in_their_own_dtype(self):
        import torch

        from golden_ref.evaluate import build_module

        class Rotary(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(4, 4)
                inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2, dtype=torch.int64).float() / 4))
                self.register_buffer("inv_freq", inv_freq, persistent=False)
                self.register_buffer("scale", torch.ones(2), persistent=False)

        for dtype, expected in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            module = build_module(_torch_case(Rotary, [], form="module", dtype=dtype))
            # As from_pretrained(dtype=...) builds it: the checkpoint's entries in the dtype, the
            # computed frequencies float32 as their code asks, other computed buffers the dtype.
            self.assertEqual(module.proj.weight.dtype, expected)
            self.assertEqual(module.inv_freq.dtype, torch.float32)
            self.assertEqual(module.scale.dtype, expected)
            self.assertEqual(torch.get_default_dtype(), torch.float32)
        module = build_module(_torch_case(Rotary, [], form="module", dtype="f32"))
        self.assertEqual(module.inv_freq.dtype, torch.float32)

    def test_tied_names_a_checkpoint_leaves_out_are_reported(self):
        import torch

        from golden_ref.evaluate import module_entries, unsaved_names

        class LM(torch.nn.Module):
            _tied_weights_keys = {"head.weight": "emb.weight"}

            def __init__(self, tie):
                super().__init__()
                self.emb = torch.nn.Embedding(5, 3)
                self.head = torch.nn.Linear(3, 5, bias=False)
                if tie:
                    self.head.weight = self.emb.weight

        for tie, expected in ((True, ["head.weight"]), (False, [])):
            lm = LM(tie)
            _, aliases = module_entries(lm)
            self.assertEqual(unsaved_names(lm, aliases), expected)

    def test_reference_taps_are_trace_points_in_execution_order_and_no_ops_outside(self):
        import torch

        import golden_ref
        from golden_ref.evaluate import forward

        class Tapping(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = torch.nn.Linear(2, 2)
                self.b = torch.nn.Linear(2, 2)

            def forward(self, x):
                h = self.a(x) * 2
                golden_ref.tap("doubled", h)
                golden_ref.tap("pair", (h, h + 1))
                return self.b(h)

        case = _torch_case(Tapping, [np.ones((1, 2))], form="module")
        case.trace = True
        result = forward(case)
        names = [name for name, _ in result["expected"]]
        self.assertEqual(names, ["out", "trace.a", "trace.doubled", "trace.pair.0", "trace.pair.1", "trace.b"])
        # Every evaluation records them: the float64 run's leaves are the same.
        self.assertEqual([n for n, _ in result["precise"]], names)
        # Untraced, and outside golden's worker, a tap does nothing.
        case.trace = False
        self.assertEqual([n for n, _ in forward(case)["expected"]], ["out"])
        golden_ref.tap("nowhere", torch.zeros(1))

    def test_a_tap_of_something_that_is_no_tensor_is_the_reference_s_error(self):
        import golden_ref
        from golden_ref.evaluate import ReferenceRaised, forward

        def taps_a_string(x):
            golden_ref.tap("label", "not a tensor")
            return x

        case = _torch_case(taps_a_string, [np.ones(2)])
        case.trace = True
        with self.assertRaises(ReferenceRaised) as raised:
            forward(case, precise=False)
        self.assertIn("golden_ref.tap('label', ...): `label` is a builtins.str", str(raised.exception))


def forward_of(fn, args):
    from golden_ref.evaluate import forward

    return forward(_torch_case(fn, args))


class ConstructorArgumentsTest(unittest.TestCase):
    """`config = "pkg.Config"(...)`: the configuration object goes in as `config=` where the
    constructor has that keyword, else first; wrappers are seen through."""

    class Config:
        def __init__(self, width=1):
            self.width = width

    def case(self, cls, init=None):
        from golden_ref.evaluate import Case

        case = Case(cls, "module", NumpyBackend(), [], {}, init or {}, 0, "f32")
        case.config = (self.Config, {"width": 3})
        return case

    def test_the_config_keyword_where_the_constructor_has_one(self):
        from golden_ref.evaluate import constructor_arguments

        class ByKeyword:
            def __init__(self, config, layer_idx=None):
                pass

        args, kwargs = constructor_arguments(self.case(ByKeyword, {"layer_idx": 2}))
        self.assertEqual(args, ())
        self.assertEqual(kwargs["layer_idx"], 2)
        self.assertEqual(kwargs["config"].width, 3)

    def test_first_otherwise_and_through_a_wrapper(self):
        from golden_ref.evaluate import constructor_arguments

        class Positional:
            def __init__(self, cfg):
                pass

        class Wrapper:
            golden_inner = Positional

            def __init__(self, *args, **kwargs):
                pass

        for cls in (Positional, Wrapper):
            args, kwargs = constructor_arguments(self.case(cls))
            self.assertEqual(len(args), 1)
            self.assertEqual(args[0].width, 3)
            self.assertEqual(kwargs, {})

    def test_a_config_that_raises_names_the_class(self):
        from golden_ref.evaluate import ReferenceRaised, constructor_arguments

        case = self.case(object)
        case.config = (self.Config, {"depth": 1})
        with self.assertRaises(ReferenceRaised) as raised:
            constructor_arguments(case)
        self.assertIn("constructing its configuration `Config`", raised.exception.phase)


class ProvenanceTest(unittest.TestCase):
    def test_names_python_numpy_and_the_defining_file(self):
        from golden_ref.evaluate import nudge as defined_here
        from golden_ref.references import provenance

        p = provenance([defined_here])
        self.assertRegex(p["python"], r"^\d+\.\d+\.\d+$")
        self.assertIn("numpy", p["packages"])
        self.assertEqual(list(p["sources"]), ["golden_ref/evaluate.py"])
        self.assertRegex(p["sources"]["golden_ref/evaluate.py"], "^[0-9a-f]{64}$")
