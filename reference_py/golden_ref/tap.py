"""Trace points inside reference code: `golden_ref.tap("q_rot", q)`.

A traced check compares the port's `golden::tap` points with the outputs of the reference's
submodules (forward hooks). An intermediate that no submodule returns — the queries after the
rotary embedding, a residual sum inside a block's `forward` — has no hook; the reference names it
itself:

    from golden_ref import tap

    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    tap("q_rot", q)

and the port taps the same name (`golden::tap("q_rot", &q)`). The point is `trace.q_rot`, in
execution order among the submodules' points; a name tapped again is `q_rot#2`, `q_rot#3`, as a
module called again is. A tuple, list or dict of tensors is several points (`q_rot.0`, …).

Outside golden's worker (plain Python, a notebook, production code) `tap` does nothing and costs a
global lookup: it imports neither torch nor anything of golden's worker, so reference code can keep
its taps. Only a traced evaluation of the worker records them (`evaluate.py`, `repro.py`).
"""

from __future__ import annotations

import contextlib

# The list the running traced evaluation records into, or None: then `tap` does nothing.
_recording = None


def tap(name: str, value) -> None:
    """Record `value` (a tensor, or a tuple/list/dict of them) as the trace point `name` when a
    traced golden evaluation is running; otherwise do nothing."""
    recorder = _recording
    if recorder is not None:
        recorder(str(name), value)


@contextlib.contextmanager
def recording(recorder):
    """While the block runs, `tap(name, value)` calls `recorder(name, value)`; nested uses restore
    the outer recorder."""
    global _recording
    previous = _recording
    _recording = recorder
    try:
        yield
    finally:
        _recording = previous
