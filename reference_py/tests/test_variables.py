import os
import subprocess
import sys
import unittest
from unittest import mock

from golden_ref import variables, wire


class VariablesTest(unittest.TestCase):
    """The GOLDEN_* variables the worker reads: a value it cannot read is named, never ignored."""

    def test_the_frame_limit_can_only_be_lowered_and_a_bad_one_is_named(self):
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("GOLDEN_MAX_FRAME", None)
            self.assertEqual(wire._max_frame(), wire.LIMIT)
        with mock.patch.dict(os.environ, {"GOLDEN_MAX_FRAME": " 8388608 "}):
            self.assertEqual(wire._max_frame(), 8388608)
        for bad in ["-1", "0", "lots", "1.5", str(wire.LIMIT + 1)]:
            with mock.patch.dict(os.environ, {"GOLDEN_MAX_FRAME": bad}):
                with self.assertRaises(variables.VariableError) as raised:
                    wire._max_frame()
                self.assertIn(f'GOLDEN_MAX_FRAME="{bad}" is not a frame limit', str(raised.exception))

    def test_an_empty_value_is_unset(self):
        with mock.patch.dict(os.environ, {"GOLDEN_MAX_FRAME": "  "}):
            self.assertEqual(wire._max_frame(), wire.LIMIT)

    def test_a_worker_given_an_unreadable_parent_pid_says_so(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "GOLDEN_PARENT_PID": "abc", "PYTHONPATH": root}
        out = subprocess.run(
            [sys.executable, "-B", "-m", "golden_ref.worker"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
        self.assertNotEqual(out.returncode, 0)
        self.assertIn('GOLDEN_PARENT_PID="abc" is not a process id', out.stderr)


if __name__ == "__main__":
    unittest.main()
