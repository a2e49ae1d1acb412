"""Python side of golden: a worker process that runs PyTorch/NumPy references for the Rust runtime.

The Rust runtime starts ``python -m golden_ref.worker`` once per test process (or pool slot) and talks
to it over stdin/stdout with the framed binary protocol of :mod:`golden_ref.wire`.

Reference code can name intermediates for traced checks with ``golden_ref.tap(name, tensor)``
(:mod:`golden_ref.tap`): a no-op outside golden's worker, importable from plain Python.
"""

from .tap import tap  # noqa: F401  (re-exported: `golden_ref.tap(...)`)
