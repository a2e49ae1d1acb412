"""Where a reference calls a torch op or a submodule: its call site in the reference's source.

A site is the innermost frame that is neither torch's, golden's nor the standard library's (for a
reference that is itself a torch module, its own frame in torch), shown as `file:line` relative to
its import root or site-packages, never the machine's path; with the call's source text when it
fits on its line, and the lines of model code that call a helper (an activation module, a rotary
function). Used by the mutation diagnosis (:mod:`golden_ref.mutations`, :mod:`golden_ref.structure`).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig

import torch


def _roots(*paths):
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


_TORCH = _roots(os.path.dirname(torch.__file__))
_GOLDEN = _roots(os.path.dirname(os.path.abspath(__file__)))
# A venv's platstdlib is its own lib/pythonX.Y, which holds site-packages: those are not stdlib.
_STDLIB = _roots(sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"))
INTERNAL: dict = {}
_MACHINERY = tuple(os.path.join("torch", *p.split("/")) for p in (
    "overrides.py", "nn/functional.py", "functional.py", "_tensor.py", "nn/modules/module.py",
    "utils/_contextlib.py", "_jit_internal.py"))


def _stdlib(real: str) -> bool:
    return real.startswith(_STDLIB) and not any(
        part in ("site-packages", "dist-packages") for part in real.split(os.sep))


def _kind(filename: str) -> int:
    """0: a call site; 1: torch's own code (a site only when no other frame is: a reference that is
    a torch module); 2: golden's and the standard library's, never."""
    found = INTERNAL.get(filename)
    if found is None:
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        if filename.startswith("<frozen") or real.startswith(_GOLDEN) or _stdlib(real):
            found = 2
        elif real.startswith(_TORCH):
            found = 1
        else:
            found = 0
        INTERNAL[filename] = found
    return found


def internal(filename: str) -> bool:
    """torch's own frames, golden's and the standard library's are not call sites."""
    return _kind(filename) != 0


_DISPLAY: dict = {}


def display_path(filename: str) -> str:
    """A path relative to the import root or site-packages it is under, never the machine's."""
    shown = _DISPLAY.get(filename)
    if shown is None:
        real = os.path.realpath(filename)
        best = None
        for entry in sys.path:
            if not entry:
                continue
            root = os.path.join(os.path.realpath(entry), "")
            if real.startswith(root) and (best is None or len(root) > len(best)):
                best = root
        shown = real[len(best):] if best else os.path.basename(real)
        _DISPLAY[filename] = shown
    return shown


class Site:
    """Where the reference calls an op: the innermost frame outside torch and golden."""

    __slots__ = ("key", "op", "file", "line", "function", "callers", "calls", "text", "code", "modules",
                 "memo")

    def __init__(self, key, op, file, line, function, text=None, code=None):
        self.key = key
        self.op = op
        self.file = file
        self.line = line
        self.function = function
        self.callers = []  # chains of callers in other files, see `_callers`
        self.calls = 0
        self.text = text  # the call's source text, when it fits on its line
        self.code = code  # the whole source line, stripped
        self.modules = set()  # the submodules it was called in (their names), see structure.py
        self.memo = {}  # what a family works out once per site (a formula's name)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def frame_of_call(frame):
    """The frame of the reference's source that is making the current call (skipping torch's,
    golden's and the standard library's), or, for a reference that is a torch module, its own
    frame in torch; None when there is none."""
    start = frame
    while frame is not None and internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        # The reference is torch's own (`torch.nn.LayerNorm`): its innermost torch frame that is
        # not dispatch machinery (the module's forward, not `overrides.py`).
        frame = start
        while frame is not None and (_kind(frame.f_code.co_filename) != 1
                                     or frame.f_code.co_filename.endswith(_MACHINERY)):
            frame = frame.f_back
    return frame


_POSITIONS: dict = {}


def _positions(code):
    """(line, end line, column, end column) of each instruction of `code`, worked out once per code
    object (a long function asked per call would cost its length each time)."""
    found = _POSITIONS.get(code)
    if found is None:
        try:
            found = list(code.co_positions())  # Python 3.11+
        except AttributeError:
            found = []
        _POSITIONS[code] = found
    return found


def site_of(frame, op: str, sites: dict, callers: bool):
    """The call site of the op being dispatched, registered in `sites` (key -> Site)."""
    frame = frame_of_call(frame)
    if frame is None:
        return None
    code = frame.f_code
    # The function too: two functions of one file have instructions at the same offsets.
    key = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}:{frame.f_lasti}:{op}"
    site = sites.get(key)
    if site is None:
        site = Site(key, op, display_path(code.co_filename), _line(frame),
                    f"{code.co_filename}:{code.co_name}:{code.co_firstlineno}",
                    source_text(frame), source_line(frame))
        sites[key] = site
    if callers and len(site.callers) < 8:
        chain = _callers(frame)
        if chain and chain not in site.callers:
            site.callers.append(chain)
    return site


def _line(frame) -> int:
    """The frame's current line (from the positions table: `f_lineno` decodes the whole table)."""
    positions = _positions(frame.f_code)
    index = frame.f_lasti // 2
    if index < len(positions) and positions[index][0] is not None:
        return positions[index][0]
    return frame.f_lineno


def source_text(frame):
    """The source of the call the frame is making (`self.gate_proj(x)`), when it is on one line."""
    try:
        line, end_line, col, end_col = _positions(frame.f_code)[frame.f_lasti // 2]
    except (IndexError, ValueError):
        return None
    if line is None or line != end_line or col is None or end_col is None:
        return None
    text = linecache.getline(frame.f_code.co_filename, line)[col:end_col]
    return text if 0 < len(text) <= 60 else None


def source_line(frame):
    """The frame's current source line, stripped (at most 100 characters), or None."""
    text = linecache.getline(frame.f_code.co_filename, _line(frame)).strip()
    if not text:
        return None
    return text if len(text) <= 100 else text[:99] + "…"


def _callers(frame, depth: int = 8) -> tuple:
    """The frames that lead to `frame` from other files (`file:line`, innermost first), without
    torch's, golden's and decorators' (functions defined inside functions: `wrapper`)."""
    out = []
    here = frame.f_code.co_filename
    caller = frame.f_back
    while caller is not None and len(out) < depth:
        code = caller.f_code
        if not (internal(code.co_filename) or code.co_filename == here
                or "<locals>" in getattr(code, "co_qualname", "")):
            out.append((display_path(code.co_filename), _line(caller)))
        caller = caller.f_back
    return tuple(out)


def join_places(places) -> str:
    """`a.py:1, :2 and b.py:3`: places of one file after the first lose the file's name."""
    out, last_file = [], None
    for place in places:
        file, _, line = place.rpartition(":")
        out.append(place if file != last_file else f":{line}")
        last_file = file
    if len(out) > 1:
        return ", ".join(out[:-1]) + " and " + out[-1]
    return out[0]
