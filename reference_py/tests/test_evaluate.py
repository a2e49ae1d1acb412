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
