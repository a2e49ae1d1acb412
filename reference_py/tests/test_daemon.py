import os
import socket
import unittest

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


if __name__ == "__main__":
    unittest.main()
