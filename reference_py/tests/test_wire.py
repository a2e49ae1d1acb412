import io
import struct
import unittest

import numpy as np

from golden_ref import wire


def sample():
    tensors = [
        wire.WireTensor("f32", np.arange(6, dtype="<f4").reshape(2, 3)),
        wire.WireTensor("bool", np.array(True)),
        wire.WireTensor("bf16", np.array([0x3F80, 0xC000], dtype="<u2")),
    ]
    return wire.encode_frame(9, {"op": "forward", "args": [{"$t": 0}]}, tensors)


class WireTest(unittest.TestCase):
    def test_round_trip(self):
        request_id, header, tensors = wire.read_frame(io.BytesIO(sample()))
        self.assertEqual(request_id, 9)
        self.assertEqual(header["op"], "forward")
        self.assertEqual([t.dtype for t in tensors], ["f32", "bool", "bf16"])
        np.testing.assert_array_equal(tensors[0].array, np.arange(6).reshape(2, 3))
        self.assertEqual(tensors[1].shape, ())
        self.assertIs(wire.resolve_refs(header["args"], tensors)[0], tensors[0])

    def test_eof_before_a_frame_is_none(self):
        self.assertIsNone(wire.read_frame(io.BytesIO(b"")))

    def test_every_truncation_is_a_protocol_error(self):
        data = sample()
        for cut in range(1, len(data)):
            with self.assertRaises(wire.ProtocolError, msg=f"cut at {cut}"):
                wire.read_frame(io.BytesIO(data[:cut]))

    def test_a_lying_byte_count_is_refused(self):
        data = bytearray(sample())
        header_len = struct.unpack_from("<I", data, 16)[0]
        at = 20 + header_len + 4 + 2 + 16
        struct.pack_into("<Q", data, at, 10**12)
        with self.assertRaisesRegex(wire.ProtocolError, "bytes for shape"):
            wire.read_frame(io.BytesIO(bytes(data)))

    def test_bad_magic(self):
        data = bytearray(sample())
        data[4:8] = b"NOPE"
        with self.assertRaisesRegex(wire.ProtocolError, "bad magic"):
            wire.read_frame(io.BytesIO(bytes(data)))

    def test_a_huge_length_is_refused_before_reading(self):
        with self.assertRaisesRegex(wire.ProtocolError, "larger than the limit"):
            wire.read_frame(io.BytesIO(struct.pack("<I", 0xFFFF_FFFF)))


if __name__ == "__main__":
    unittest.main()
