import unittest

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None


def two_gelus(x):
    a = F.gelu(x)
    b = F.gelu(x * 2)
    return a + b


def mlp_like(x, w1, w2):
    return F.linear(F.gelu(F.linear(x, w1)), w2)


class Swiglu(torch.nn.Module if torch else object):
    def __init__(self, d=4, hidden=6):
        super().__init__()
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


@unittest.skipIf(torch is None, "needs torch")
class MutationTest(unittest.TestCase):
    def setUp(self):
        from golden_ref.backends import TorchBackend
        from golden_ref.wire import WireTensor

        self.backend = TorchBackend()
        self.wire = lambda a: WireTensor("f32", np.ascontiguousarray(a, dtype=np.float32))
        self.rng = np.random.default_rng(0)

    def case(self, obj, args, form="function", init=None):
        from golden_ref.evaluate import Case

        return Case(obj, form, self.backend, [self.wire(a) for a in args], {}, init or {}, 3, "f32")

    def search(self, case, port):
        from golden_ref import mutations

        return mutations.search(case, [("out", self.wire(port))])

    def test_the_recording_sees_each_call_with_its_site_relative_to_the_import_root(self):
        from golden_ref import mutations
        from golden_ref.mutations import catalogue_for
        from golden_ref.evaluate import forward

        case = self.case(two_gelus, [self.rng.standard_normal((2, 3))])
        recording = mutations.Recording(catalogue_for(two_gelus))
        forward(mutations._wrapped(case, recording.session), precise=False)
        gelus = [s for s in recording.sites.values() if s.op == "gelu"]
        self.assertEqual(len(gelus), 2)
        self.assertEqual({s.file for s in gelus}, {"tests/test_mutations.py"})
        self.assertEqual(gelus[1].line, gelus[0].line + 1)

    def test_a_mutation_at_one_site_leaves_the_other_alone(self):
        x = self.rng.standard_normal((2, 16)) * 2
        tx = torch.tensor(x, dtype=torch.float32)
        port = (F.gelu(tx) + F.gelu(tx * 2, approximate="tanh")).numpy()
        summary, found = self.search(self.case(two_gelus, [x]), port)
        self.assertGreaterEqual(summary["candidates"], 4)
        best = found[0][0]
        self.assertEqual(best.what, "F.gelu(approximate='tanh')")
        self.assertIn(f"test_mutations.py:{two_gelus.__code__.co_firstlineno + 2}", best.where)

    def test_the_same_mistake_at_every_site_is_one_candidate(self):
        x = self.rng.standard_normal((2, 8))
        w1, w2 = self.rng.standard_normal((8, 8)), self.rng.standard_normal((8, 8))
        t = [torch.tensor(a, dtype=torch.float32) for a in (x, w1, w2)]
        port = F.gelu(t[0] @ t[1]) @ t[2]  # both weights used untransposed
        _, found = self.search(self.case(mlp_like, [x, w1, w2]), port.numpy())
        keys = [c.key for c, _ in found]
        self.assertIn("linear-weight-transposed|x @ W|*", keys)

    def test_a_correct_port_moves_no_mutation_closer(self):
        x = self.rng.standard_normal((2, 16))
        port = (lambda t: F.gelu(t) + F.gelu(t * 2))(torch.tensor(x, dtype=torch.float32)).numpy()
        summary, found = self.search(self.case(two_gelus, [x]), port)
        self.assertEqual((summary["close"], found), (0, []))

    def test_two_projections_swapped(self):
        x = self.rng.standard_normal((1, 3, 4))
        torch.manual_seed(3)
        m = Swiglu().eval()
        with torch.no_grad():
            t = torch.tensor(x, dtype=torch.float32)
            port = m.down(F.silu(m.up(t)) * m.gate(t)).numpy()
        _, found = self.search(self.case(Swiglu, [x], form="module"), port)
        self.assertTrue(found and found[0][0].key.startswith("outputs-swapped|linear|"), [c.key for c, _ in found])

    def test_a_reference_module_of_torch_is_sited_in_torch(self):
        from golden_ref import mutations

        # In the worker, the frames above the reference are golden's own: make this file one.
        mutations._INTERNAL[__file__] = 2
        self.addCleanup(mutations._INTERNAL.pop, __file__)
        x = self.rng.standard_normal((2, 8))
        torch.manual_seed(3)
        ln = torch.nn.LayerNorm(8).eval()
        with torch.no_grad():
            port = F.layer_norm(torch.tensor(x, dtype=torch.float32), (8,), ln.weight, ln.bias, 1e-3).numpy()
        _, found = self.search(self.case(torch.nn.LayerNorm, [x], "module", {"normalized_shape": 8}), port)
        self.assertEqual(found[0][0].what, "F.layer_norm(eps=0.001)")
        self.assertTrue(found[0][0].where.startswith("torch/nn/modules/normalization.py:"), found[0][0].where)

    def test_a_user_mutation_for_one_reference(self):
        from golden_ref.catalogue import CATALOGUE, mutation
        from golden_ref.mutations import catalogue_for

        def reference(x):
            return torch.softmax(x, dim=-1)

        before = len(CATALOGUE)
        try:
            @mutation(ops="softmax", name="softmax of twice the input", fix="do not double", of=reference)
            def _(call):
                return call.run(input=call.input * 2)

            self.assertEqual(len(catalogue_for(reference)), len(catalogue_for(two_gelus)) + 1)
            x = self.rng.standard_normal((2, 5))
            port = torch.softmax(torch.tensor(x, dtype=torch.float32) * 2, dim=-1).numpy()
            _, found = self.search(self.case(reference, [x]), port)
            self.assertEqual(found[0][0].what, "softmax of twice the input")
        finally:
            del CATALOGUE[before:]

    def test_the_evidence_orders_the_search(self):
        from golden_ref.mutations import evidence, order_of_kinds

        r = self.rng.standard_normal((3, 5))
        ref = [("out", self.wire(r))]
        # A configuration's mistakes first, whatever the evidence (one mistake, one name in every
        # kind of check); then, only the last position differs: boundaries first.
        edge = r.copy()
        edge[:, -1] += 1
        self.assertEqual(order_of_kinds(evidence(ref, {"out": self.wire(edge)}))[:2], ["config", "boundary"])
        # The same values elsewhere: axes first.
        self.assertEqual(order_of_kinds(evidence(ref, {"out": self.wire(r[::-1].copy())}))[1], "axes")
        # A factor: constants first.
        self.assertEqual(order_of_kinds(evidence(ref, {"out": self.wire(r * 0.7)}))[1], "constant")

    def test_a_trace_s_first_divergence_is_searched_first(self):
        from golden_ref.mutations import Candidate, _focused

        inside = Candidate("a", "", "", "", "", modules={"layers.1.mlp.act_fn"})
        outside = Candidate("b", "", "", "", "", modules={"layers.0.mlp"})
        self.assertTrue(_focused(inside, "layers.1.mlp"))
        self.assertFalse(_focused(outside, "layers.1.mlp"))
        self.assertTrue(_focused(inside, "layers.1.mlp.act_fn.0"))  # a tuple output's point

    def test_a_mutant_that_moves_a_leaf_the_port_matches_is_not_tried_further(self):
        def two(x):
            return F.gelu(x), torch.softmax(x, dim=-1)

        x = self.rng.standard_normal((2, 6))
        t = torch.tensor(x, dtype=torch.float32)
        port = [("out.0", self.wire(F.gelu(t, approximate="tanh").numpy())),
                ("out.1", self.wire(torch.softmax(t, dim=-1).numpy()))]
        from golden_ref import mutations

        _, found = mutations.search(self.case(two, [x]), port)
        self.assertEqual(found[0][0].what, "F.gelu(approximate='tanh')")
        # Softmax over the other dim moves `out.1`, which the port matches: never close.
        self.assertFalse(any("softmax" in c.what for c, _ in found), [c.what for c, _ in found])

    def test_formulas_of_one_tensor_are_named_by_the_activation_they_compute(self):
        def quick(x):
            return x * torch.sigmoid(1.702 * x)

        x = self.rng.standard_normal((3, 7)) * 2
        port = F.gelu(torch.tensor(x, dtype=torch.float32)).numpy()
        _, found = self.search(self.case(quick, [x]), port)
        self.assertEqual(found[0][0].what,
                         "GELU (erf) in place of the quick_gelu (x·sigmoid(1.702·x)) the reference writes out")

    def test_a_submodule_skipped_is_named_as_a_module_and_as_its_op(self):
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.LayerNorm(4)
                self.ff = torch.nn.Linear(4, 4)
                self.out = torch.nn.LayerNorm(4)

            def forward(self, x):
                return self.out(x + self.ff(self.norm(x)))

        x = self.rng.standard_normal((2, 3, 4))
        torch.manual_seed(3)
        m = Block().eval()
        with torch.no_grad():
            t = torch.tensor(x, dtype=torch.float32)
            skipped = (t + m.ff(m.norm(t))).numpy()
        _, found = self.search(self.case(Block, [x], form="module"), skipped)
        # The module skipped, and (the same thing) its layer_norm call left out, both exactly.
        whats = [c.what for c, _ in found[:2]]
        self.assertIn("`out` (LayerNorm) skipped: its input passed on as its output", whats)
        self.assertIn("F.layer_norm left out (the input not normalised)", whats)
        with torch.no_grad():
            unnormed = m.out(t + m.ff(t)).numpy()  # the first norm left out
        _, found = self.search(self.case(Block, [x], form="module"), unnormed)
        self.assertTrue(any(c.kind == "structure" and c.what.startswith("`norm` (LayerNorm) skipped")
                            for c, _ in found), [c.what for c, _ in found])

    def test_arguments_change_where_they_were_given(self):
        from golden_ref.catalogue import Call

        call = Call(F.layer_norm, "layer_norm", (1, (4,), None, None, 1e-5), {})
        self.assertEqual(call.get("eps"), 1e-5)
        args, kwargs = call.changed(eps=1e-6, bias=2)
        self.assertEqual((args[4], args[3], kwargs), (1e-6, 2, {}))
        call = Call(F.layer_norm, "layer_norm", (1, (4,)), {"eps": 1e-5})
        args, kwargs = call.changed(eps=1e-6, weight=3)
        self.assertEqual(kwargs, {"eps": 1e-6, "weight": 3})


if __name__ == "__main__":
    unittest.main()
