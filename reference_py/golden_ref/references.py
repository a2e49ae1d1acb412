"""Finding the reference a `#[golden_layer(reference = "pkg.mod.callable")]` names."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import os
import sys


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
        f"({os.environ.get('PYTHONPATH', '') or 'none'}) or the site-packages of `{sys.executable}`",
    )


def _distribution_version(name: str):
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8 has no importlib.metadata; golden needs 3.9
        return None
    try:
        return metadata.version(name)
    except Exception:
        return None


def _distributions_of(top_level: str):
    """The installed distributions that provide the top-level package `top_level` (`transformers`
    for `transformers`, `PyYAML` for `yaml`); none for a package on an import root."""
    try:
        from importlib import metadata

        return list(metadata.packages_distributions().get(top_level, []))
    except Exception:  # Python 3.9 has no packages_distributions: try the package's own name
        return [top_level] if _distribution_version(top_level) else []


def _source_file(obj):
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path and path.endswith(".py") else None


def _relative_to_root(path: str) -> str:
    """`path` relative to the sys.path entry it is under (the longest), as an import names it:
    `transformers/models/llama/modeling_llama.py`, `zoo_ref/blocks.py`."""
    best = None
    for entry in sys.path:
        root = os.path.realpath(entry or os.getcwd())
        if path.startswith(root + os.sep) and (best is None or len(root) > len(best)):
            best = root
    return os.path.relpath(path, best) if best else os.path.basename(path)


def provenance(objects) -> dict:
    """What the answers of a reference made of `objects` (the reference, its configuration class)
    are computed with: Python's version, those of numpy, torch and the distributions that provide
    the objects' packages, and the SHA-256 of their source files — the file defining each object
    and, for a class, those defining its base classes in the same top-level package (Hugging
    Face's `modeling_llama.py` holds the module, its attention and `rotate_half`; its
    `PreTrainedModel` base is in `modeling_utils.py`). The runtime records it in the golden store
    and compares it on replay (`answers/provenance.rs`)."""
    packages = {}
    for name in ("numpy", "torch"):
        version = _distribution_version(name)
        if version:
            packages[name] = version
    files = []
    for obj in objects:
        top = (getattr(obj, "__module__", None) or "").split(".")[0]
        for dist in _distributions_of(top):
            version = _distribution_version(dist)
            if version:
                packages[dist] = version
        related = [obj]
        if inspect.isclass(obj):
            related += [c for c in obj.__mro__[1:] if (c.__module__ or "").split(".")[0] == top]
        for o in related:
            path = _source_file(o)
            if path and path not in files:
                files.append(path)
    sources = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                sources[_relative_to_root(path)] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            pass
    return {"python": "%d.%d.%d" % sys.version_info[:3], "packages": packages, "sources": sources}
