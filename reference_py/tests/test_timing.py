import unittest

import numpy as np

try:
    import torch
except ImportError:  # the numpy-only set-up: nothing here can run
    torch = None

from golden_ref.wire import WireTensor


class Slow(torch.nn.Module if torch else object):
    """A layer that does `repeats` matrix products where one would do."""

    def __init__(self, repeats):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(128, 128))
        self.repeats = repeats

    def forward(self, x):
        y = x
        for _ in range(self.repeats):
            y = x @ self.weight
        return y


class TwoLayers(torch.nn.Module if torch else object):
    """A cheap layer, then one that does the same work forty times over."""

    def __init__(self):
        super().__init__()
        self.fast = Slow(1)
        self.slow = Slow(40)

    def forward(self, x):
        return self.slow(self.fast(x))


class Counter(torch.nn.Module if torch else object):
    """A module that keeps state between calls: every timing run must start it afresh."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("called twice on one copy")
        return x * 2


def _case(obj, x, form="module"):
    from golden_ref.backends import TorchBackend
    from golden_ref.evaluate import Case

    return Case(obj, form, TorchBackend(), [WireTensor("f32", np.asarray(x, dtype=np.float32))], {}, {}, 7, "f32")


@unittest.skipIf(torch is None, "needs torch")
class TimingTest(unittest.TestCase):
    def test_every_run_is_timed_and_the_slow_point_takes_the_time(self):
        from golden_ref.timing import measure

        answer = measure(_case(TwoLayers, np.ones((64, 128))), warmup=1, runs=3, points=True)
        self.assertEqual(len(answer["totals"]), 3)
        self.assertTrue(all(t > 0 for t in answer["totals"]))
        self.assertEqual(answer["threads"], torch.get_num_threads())
        self.assertEqual(len(answer["points"]), 3)
        for run in answer["points"]:
            names = [name for name, _ in run]
            self.assertEqual(names, ["trace.fast", "trace.slow"])
            (_, fast), (_, slow) = run
            # Each point is marked when its module returns, since the call began.
            self.assertGreater(slow, fast)
            # The slow layer does forty times the work of the fast one.
            self.assertGreater(slow - fast, 5 * fast)

    def test_a_module_with_state_starts_every_run_afresh(self):
        from golden_ref.timing import measure

        answer = measure(_case(Counter, np.ones((2, 3))), warmup=2, runs=3, points=False)
        self.assertEqual(len(answer["totals"]), 3)
        self.assertIsNone(answer["points"])

    def test_a_schedule_times_each_step_without_the_one_shot_forward(self):
        from golden_ref.schedule import Plan
        from golden_ref.timing import measure

        class Cumulative(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.total = None

            def forward(self, x):
                step = x.cumsum(1) + (0 if self.total is None else self.total)
                self.total = step[:, -1:]
                return step

        case = _case(Cumulative, np.ones((1, 5, 2)))
        case.schedule = Plan({"arg": 0, "axis": 1, "chunks": [3, 1, 1], "oneshot": True})
        answer = measure(case, warmup=1, runs=2, points=False)
        self.assertEqual([[k, t] for k, t, _ in answer["steps"][0]], [[0, 3], [1, 1], [2, 1]])
        self.assertFalse(case.schedule.oneshot)
        self.assertIsNone(case.schedule.clock)

    def test_the_memory_a_run_allocates_shows_as_the_peak_rise(self):
        from golden_ref.timing import measure

        class Allocates(torch.nn.Module):
            def forward(self, x):
                big = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
                return x + big[:1].float()

        answer = measure(_case(Allocates, np.ones(1)), warmup=1, runs=2, points=False)
        # Linux lets a process reset its own peak (/proc/self/clear_refs).
        self.assertIsNotNone(answer["peak_bytes"], answer["memory"])
        self.assertGreaterEqual(answer["peak_bytes"], 60 << 20)


if __name__ == "__main__":
    unittest.main()
