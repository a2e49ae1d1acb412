import os
import socket
import tempfile
import unittest
from unittest import mock

from golden_ref import daemon


class PeerCheckTest(unittest.TestCase):
    """The shared worker's daemon serves its own user only (`daemon.peer_allowed`)."""

    def test_only_the_daemons_own_uid_is_let_in(self):
        self.assertTrue(daemon.peer_allowed((1234, 1000, 1000), 1000))
        self.assertFalse(daemon.peer_allowed((1234, 1001, 1000), 1000))
        self.assertFalse(daemon.peer_allowed((1234, 0, 0), 1000))

    def test_a_peer_whose_credentials_cannot_be_read_is_refused(self):
        self.assertFalse(daemon.peer_allowed(None, os.getuid()))

    def test_credentials_are_the_peers_own(self):
        a, b = socket.socketpair(socket.AF_UNIX)
        try:
            credentials = daemon.peer_credentials(a)
        finally:
            a.close()
            b.close()
        self.assertEqual(credentials, (os.getpid(), os.getuid(), os.getgid()))
        self.assertTrue(daemon.peer_allowed(credentials, os.getuid()))


class ExitRecordTest(unittest.TestCase):
    """How a served copy ended reaches the runtime as a whole file (`daemon.record_exit`)."""

    def test_the_file_appears_whole_and_nothing_else_is_left(self):
        with tempfile.TemporaryDirectory() as directory:
            seen = []
            real_replace = os.replace

            def replace(src, dst):
                # Until the rename, the name the runtime reads does not exist.
                seen.append(os.path.exists(dst))
                real_replace(src, dst)

            with mock.patch.object(os, "replace", replace):
                daemon.record_exit(directory, 4242, 3 << 8)
            self.assertEqual(seen, [False])
            self.assertEqual(os.listdir(directory), ["worker-4242.exit"])
            with open(os.path.join(directory, "worker-4242.exit")) as f:
                self.assertEqual(f.read(), "exit code 3")


class AdoptEnvironmentTest(unittest.TestCase):
    """A served copy takes its test process's environment in place of the daemon's
    (`worker.adopt_environment`), for Python and the C library alike."""

    def test_the_environment_becomes_exactly_the_one_sent(self):
        import ctypes

        from golden_ref import worker

        saved = dict(os.environb)
        try:
            os.environb[b"GOLDEN_TEST_DAEMONS_OWN"] = b"1"
            os.environb[b"SCALE"] = b"2"
            sent = {b"SCALE": b"3", b"NOT_UTF8": b"\xff\xfe", b"EMPTY": b""}
            worker.adopt_environment([[k.hex(), v.hex()] for k, v in sent.items()])
            self.assertEqual(dict(os.environb), sent)
            self.assertEqual(os.environ["SCALE"], "3")
            getenv = ctypes.CDLL(None).getenv
            getenv.restype = ctypes.c_char_p
            self.assertEqual(getenv(b"SCALE"), b"3")
            self.assertIsNone(getenv(b"GOLDEN_TEST_DAEMONS_OWN"))
        finally:
            for name in list(os.environb):
                del os.environb[name]
            os.environb.update(saved)


if __name__ == "__main__":
    unittest.main()
