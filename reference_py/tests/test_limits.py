import io
import unittest
from unittest import mock

import numpy as np

from golden_ref import limits, wire
from golden_ref import worker as worker_module


class AnswerLimitTest(unittest.TestCase):
    """An answer over the frame limit is refused with the leaf, its size and the limit."""

    def test_an_output_over_the_limit_is_refused_from_its_shape(self):
        # 2^40 float32 elements that take 4 bytes of memory: only the shape is looked at.
        huge = np.broadcast_to(np.float32(1.0), (1 << 20, 1 << 20))
        small = np.zeros(3, dtype=np.float32)
        with self.assertRaises(limits.AnswerTooLarge) as raised:
            limits.check_answer([("out.0", small), ("out.1", huge)], [], "f32", precise=True)
        message = str(raised.exception)
        self.assertIn("`out.1` (f32 [1048576, 1048576], 4096.00 GiB)", message)
        self.assertIn("with the float64 values and rounding estimates", message)
        self.assertIn("frame limit of 2.00 GiB", message)
        self.assertIn("dims(...)", message)

    def test_the_float64_parts_count_only_when_asked_for(self):
        out = [("out", np.zeros(1 << 20, dtype=np.float32))]  # 4 MiB, 24 MiB with float64 parts
        with mock.patch.object(wire, "MAX_FRAME", 8 << 20):
            limits.check_answer(out, [], "f32", precise=False)
            with self.assertRaisesRegex(limits.AnswerTooLarge, r"24\.0 MiB with the float64"):
                limits.check_answer(out, [], "f32", precise=True)

    def test_a_leaf_is_counted_in_the_case_dtype(self):
        out = [("out", np.zeros(1 << 20, dtype=np.float64))]
        with mock.patch.object(wire, "MAX_FRAME", 4 << 20):
            with self.assertRaisesRegex(limits.AnswerTooLarge, r"`out` \(bf16 \[1048576\], 2\.0 MiB\)"):
                limits.check_answer(out, [], "bf16", precise=True)


class FrameLimitTest(unittest.TestCase):
    def test_a_frame_over_the_limit_is_refused_before_anything_is_written(self):
        tensor = wire.WireTensor("f32", np.zeros((2, 1 << 20), dtype=np.float32))
        with mock.patch.object(wire, "MAX_FRAME", 1 << 20):
            with self.assertRaisesRegex(wire.FrameTooLarge, r"largest tensor is f32 \[2, 1048576\] \(8\.0 MiB\)"):
                wire.frame_parts(1, {}, [tensor])
        # Within the limit, the computed length is the frame's.
        data = wire.encode_frame(1, {"a": 1}, [tensor])
        self.assertEqual(int.from_bytes(data[:4], "little"), len(data) - 4)

    def test_the_worker_answers_an_oversized_answer_with_an_error_and_carries_on(self):
        big = wire.WireTensor("f32", np.zeros(1 << 20, dtype=np.float32))

        def handle(self, header, tensors):
            if header["op"] == "big":
                return {"out": {"$t": 0}}, [big]
            return {}, []

        requests = wire.encode_frame(1, {"op": "big"}, []) + wire.encode_frame(2, {"op": "small"}, [])
        out = io.BytesIO()
        with mock.patch.object(wire, "MAX_FRAME", 1 << 20), mock.patch.object(worker_module.Worker, "handle", handle):
            self.assertEqual(worker_module.serve(io.BytesIO(requests), out), 0)
        answers = io.BytesIO(out.getvalue())
        first, second = wire.read_frame(answers), wire.read_frame(answers)
        self.assertEqual(first[0], 1)
        self.assertEqual(first[1]["error"]["kind"], "too_large")
        self.assertIn("the answer to `big` is too large", first[1]["error"]["message"])
        self.assertEqual(second[:2], (2, {"ok": True}))


if __name__ == "__main__":
    unittest.main()
