"""The GOLDEN_* variables the worker reads itself, read as the runtime reads them.

Every variable golden reads is declared in `runtime/src/describe/env.rs`, which reads every one that
is set before a check runs any case; the worker reads two of them again when it starts
(`GOLDEN_MAX_FRAME` in :mod:`golden_ref.wire`, `GOLDEN_PARENT_PID` in :mod:`golden_ref.worker`), by
the same rules: a value it cannot read is an error that names the variable and the accepted form,
never a default taken in silence.
"""

from __future__ import annotations

import json
import os


class VariableError(ValueError):
    """A GOLDEN_* variable is set to a value golden cannot read."""


def whole_number(name: str, default: int, lowest: int, highest: int, form: str) -> int:
    """The variable `name` as a whole number from `lowest` to `highest`; `default` when it is unset
    or empty. `form` says what it is and where it comes from, for the error."""
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or not lowest <= number <= highest:
        raise VariableError(f"{name}={json.dumps(value)} is not {form}")
    return number
