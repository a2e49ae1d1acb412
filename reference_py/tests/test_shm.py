import errno
import io
import os
import unittest
from unittest import mock

import numpy as np

from golden_ref import shm, wire
from golden_ref import worker as worker_module


def runtime_frame(arrays, min_bytes=1024, request_id=3, header=None, **declared):
    """A request as the runtime sends it: arrays of at least `min_bytes` in an arena of this process
    (standing in for the runtime's), with the `$shm` object that names it (and says that answers
    may use shared memory too; `declared` overrides what it says of the arena)."""
    arena = shm.WriteArena(sum(shm.align(a.nbytes) for a in arrays) + 4096)
    describe = arena.describe
    arena.describe = lambda: {**describe(), "min": min_bytes, **declared}
    tensors = [wire.WireTensor("f32", a) for a in arrays]
    session = shm.Session(None)
    session.min = min_bytes
    session.writer = arena
    parts = wire.frame_parts(request_id, dict(header or {"op": "echo"}), tensors, session)
    return b"".join(bytes(p) for p in parts), arena


class ArenaTest(unittest.TestCase):
    def test_a_frame_s_large_tensors_are_read_from_the_writer_s_arena(self):
        big, small = np.arange(1000, dtype="<f4"), np.arange(3, dtype="<f4")
        data, arena = runtime_frame([big, small])
        self.assertLess(len(data), 1000, "the large tensor is not in the frame")
        session = shm.Session(os.getpid())
        request_id, header, tensors = wire.read_frame(io.BytesIO(data), session)
        self.assertEqual(header["$shm"]["name"], arena.name)
        np.testing.assert_array_equal(tensors[0].array, big)
        np.testing.assert_array_equal(tensors[1].array, small)
        self.assertFalse(tensors[0].array.flags.writeable, "a view of the runtime's arena is read-only")
        self.assertTrue(tensors[1].array.flags.writeable)

    def test_without_a_session_a_shared_tensor_is_a_protocol_error(self):
        data, _ = runtime_frame([np.zeros(1000, dtype="<f4")])
        with self.assertRaisesRegex(wire.ProtocolError, "tensor 0 lives in shared memory"):
            wire.read_frame(io.BytesIO(data))

    def test_an_arena_of_another_process_or_a_file_is_refused(self):
        data, arena = runtime_frame([np.zeros(1000, dtype="<f4")])
        with self.assertRaisesRegex(wire.ProtocolError, "not to this worker's peer 1"):
            wire.read_frame(io.BytesIO(data), shm.Session(1))
        with open(__file__, "rb") as decoy:
            desc = {**arena.describe(), "fd": decoy.fileno()}
            with self.assertRaisesRegex(shm.BadArena, "not that memfd"):
                shm.ReadArena(desc, os.getpid())
        for name in ("../x", f"golden-{os.getpid() + 1}-1", "golden-1-x"):
            with self.assertRaisesRegex(shm.BadArena, "is not golden-"):
                shm.ReadArena({**arena.describe(), "name": name}, os.getpid())
        with self.assertRaisesRegex(shm.BadArena, "not the 1099511627776"):
            shm.ReadArena({**arena.describe(), "size": 1 << 40}, os.getpid())

    def test_an_unsealed_memfd_is_refused(self):
        name = f"golden-{os.getpid()}-77"
        fd = os.memfd_create(name)
        try:
            os.ftruncate(fd, 4096)
            with self.assertRaisesRegex(shm.BadArena, "not sealed"):
                shm.ReadArena({"pid": os.getpid(), "fd": fd, "name": name, "size": 4096}, os.getpid())
        finally:
            os.close(fd)

    def test_a_tensor_outside_the_arena_is_refused(self):
        # The arena declares fewer bytes than the tensor takes.
        data, _ = runtime_frame([np.zeros(1000, dtype="<f4")], size=16)
        with self.assertRaisesRegex(wire.ProtocolError, "outside the shared memory"):
            wire.read_frame(io.BytesIO(data), shm.Session(os.getpid()))

    def test_an_arena_that_grew_is_mapped_again(self):
        arena = shm.WriteArena(4096)
        session = shm.Session(os.getpid())
        self.assertEqual(session.attach(arena.describe()).size, 4096)
        arena.reserve(3 << 20)
        arena.write(3 << 20 - 4, np.array([7.0], dtype="<f4"))
        reader = session.attach(arena.describe())
        self.assertEqual(reader.size, 3 << 20)
        self.assertEqual(reader.array(3 << 20 - 4, 4, np.dtype("<f4"), (1,))[0], 7.0)


class AnswerTest(unittest.TestCase):
    """The worker answers through its arena when the request allows it."""

    def serve(self, requests: bytes, session_patch=None):
        out = io.BytesIO()
        with mock.patch.object(shm.Session, "__init__", _session_init(os.getpid())):
            self.assertEqual(worker_module.serve(io.BytesIO(requests), out, peer=os.getpid()), 0)
        return io.BytesIO(out.getvalue())

    def test_hello_answers_the_offer_with_an_arena_and_echo_comes_back_through_it(self):
        arena = shm.WriteArena(1 << 20)
        offer = {**arena.describe(), "min": 1024}
        hello = wire.encode_frame(1, {"op": "hello", "$shm": offer}, [])
        big = np.arange(2000, dtype="<f4")
        echo, _ = runtime_frame([big], request_id=2)
        answers = self.serve(hello + echo)
        reader = shm.Session(os.getpid())
        _, info, _ = wire.read_frame(answers, reader)
        self.assertEqual(info["shm"]["pid"], os.getpid())
        self.assertNotIn("shm_error", info)
        # The answer names the worker's arena, whose memfd closed with `serve`'s session: what a
        # reader of a worker that is gone sees. (`serve` ran here, so the answer cannot be read.)
        with self.assertRaisesRegex(wire.ProtocolError, "tensor 0: cannot open the shared memory golden-"):
            wire.read_frame(answers, reader)

    def test_echo_comes_back_through_the_worker_s_arena(self):
        session = shm.Session(os.getpid())
        worker = worker_module.Worker(session)
        worker.extra_info = {}
        big = np.arange(2000, dtype="<f4")
        echo, _ = runtime_frame([big, big[:5]], request_id=2)
        out = io.BytesIO()
        self.assertEqual(worker_module._serve(worker, session, io.BytesIO(echo), out), 0)
        data = out.getvalue()
        self.assertLess(len(data), 1000, "the large tensor is not in the answer's frame")
        request_id, header, tensors = wire.read_frame(io.BytesIO(data), shm.Session(os.getpid()))
        self.assertEqual(header["$shm"]["name"], session.writer.name)
        np.testing.assert_array_equal(tensors[0].array, big)
        np.testing.assert_array_equal(tensors[1].array, big[:5])
        session.close()

    def test_a_worker_whose_arena_cannot_grow_answers_inline_and_says_why_once(self):
        arena = shm.WriteArena(1 << 20)
        offer = {**arena.describe(), "min": 1024}
        frames = wire.encode_frame(1, {"op": "hello", "$shm": offer}, [])
        for i in (2, 3):
            frames += runtime_frame([np.arange(2000, dtype="<f4")], request_id=i)[0]
        real = os.posix_fallocate

        def full(fd, offset, length):
            if length > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, offset, length)

        with mock.patch.object(os, "posix_fallocate", full):
            answers = self.serve(frames)
        wire.read_frame(answers)
        _, second, tensors = wire.read_frame(answers)
        _, third, more = wire.read_frame(answers)
        self.assertIn("No space left on device", second["$shm_fallback"])
        self.assertNotIn("$shm_fallback", third)
        np.testing.assert_array_equal(tensors[0].array, np.arange(2000))
        np.testing.assert_array_equal(more[0].array, np.arange(2000))

    def test_without_memfd_hello_says_why(self):
        arena = shm.WriteArena(4096)
        hello = wire.encode_frame(1, {"op": "hello", "$shm": {**arena.describe(), "min": 1}}, [])
        with mock.patch.object(shm.os, "memfd_create", None), mock.patch.object(shm, "hasattr", lambda o, n: False, create=True):
            answers = self.serve(hello)
        _, info, _ = wire.read_frame(answers)
        self.assertIn("no os.memfd_create", info["shm_error"])
        self.assertNotIn("shm", info)


def _session_init(peer):
    real = shm.Session.__init__

    def init(self, _peer):
        real(self, peer)

    return init


class IdleTest(unittest.TestCase):
    def test_a_large_session_lets_go_of_its_arenas(self):
        session = shm.Session(os.getpid())
        session.min = 1
        self.assertIsNotNone(session.arena_for(shm.KEEP + 1))
        self.assertTrue(session.large())
        session.release()
        self.assertFalse(session.large())
        self.assertIsNone(session.writer)

    def test_idle_is_false_for_a_stream_without_a_descriptor(self):
        self.assertFalse(worker_module._idle(io.BytesIO(b""), 0.01))
        r, w = os.pipe()
        try:
            with os.fdopen(r, "rb", buffering=0) as stream:
                self.assertTrue(worker_module._idle(stream, 0.01))
                os.write(w, b"x")
                self.assertFalse(worker_module._idle(stream, 0.01))
        finally:
            os.close(w)


if __name__ == "__main__":
    unittest.main()
