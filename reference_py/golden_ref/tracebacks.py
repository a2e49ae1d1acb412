"""Tracebacks that start at the user's code: golden's own frames and importlib's are noise there."""

from __future__ import annotations

import os
import traceback

_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_noise(frame: traceback.FrameSummary) -> bool:
    filename = frame.filename or ""
    return (
        os.path.dirname(os.path.abspath(filename)) == _OWN_DIR
        or filename.startswith("<frozen importlib")
        or os.sep + "importlib" + os.sep in filename
    )


def format_user_traceback(error: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not _is_noise(f)]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines)
