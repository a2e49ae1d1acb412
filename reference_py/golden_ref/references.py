"""Finding the reference a `#[golden_layer(reference = "pkg.mod.callable")]` names."""

from __future__ import annotations

import difflib
import importlib
import os


from .tracebacks import format_user_traceback


class ReferenceError_(Exception):
    """A reference cannot be resolved. `kind` tells the runtime which fix to suggest."""

    def __init__(self, kind: str, message: str, tb: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.traceback = tb


def _missing_is_this_module(error: ModuleNotFoundError, module_name: str) -> bool:
    """True when the import failed because `module_name` (or a parent package) does not exist,
    not because something *inside* it imports a module that is missing."""
    missing = error.name or ""
    return missing == module_name or module_name.startswith(missing + ".")


def resolve(path: str):
    """Import the longest importable module prefix of `path` and walk the rest as attributes."""
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ReferenceError_(
            "invalid",
            f"`{path}` is not a dotted Python path like `package.module.function`",
        )
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if _missing_is_this_module(e, module_name):
                continue
            raise ReferenceError_(
                "import",
                f"importing `{module_name}` failed: {type(e).__name__}: {e}",
                format_user_traceback(e),
            ) from None
        except BaseException as e:  # a module that raises while importing, SyntaxError included
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise ReferenceError_(
                "import",
                f"importing `{module_name}` raised {type(e).__name__}: {e}",
                format_user_traceback(e),
            ) from None
        obj = module
        walked = module_name
        for attr in parts[split:]:
            if not hasattr(obj, attr):
                names = [n for n in dir(obj) if not n.startswith("_")]
                close = difflib.get_close_matches(attr, names, n=3)
                hint = f"; did you mean {', '.join(f'`{walked}.{c}`' for c in close)}?" if close else ""
                raise ReferenceError_(
                    "attribute",
                    f"`{walked}` has no attribute `{attr}`{hint}",
                )
            obj = getattr(obj, attr)
            walked = f"{walked}.{attr}"
        if not callable(obj):
            raise ReferenceError_(
                "not_callable", f"`{path}` is a {type(obj).__name__}, not a callable"
            )
        return obj
    raise ReferenceError_(
        "import",
        f"no module named `{parts[0]}` in golden's import roots "
        f"({os.environ.get('PYTHONPATH', '') or 'none'}) or the interpreter's site-packages. Put the "
        "reference's folder in GOLDEN_REFERENCE_PATH, or in `reference_py/` beside your Cargo.toml.",
    )
