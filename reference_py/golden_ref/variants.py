"""Known variants of a reference: the usual ways a port gets it subtly wrong.

When a port does not match its reference, golden evaluates the reference's registered variants on
the failing case and reports those the port matches, with their fix ("the port matches
`gelu(approximate='tanh')`: use gelu_erf"). Declare variants next to the reference, in its module or
in any module its package imports::

    from golden_ref.variants import variant

    def layer_norm(x, weight, bias, eps=1e-5):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    @variant(of=layer_norm, name="eps=1e-6", fix="use eps = 1e-5, as the reference does")
    def _(x, weight, bias, eps=1e-5):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-6)

A variant of a function takes the reference's arguments. A variant of an nn.Module class takes the
constructed module (with the case's weights) first, then the forward's arguments. A variant that
raises on a case (a transpose of a non-square weight, say) is skipped for that case.
"""

from __future__ import annotations


class Variant:
    __slots__ = ("name", "fn", "fix")

    def __init__(self, name: str, fn, fix: str):
        self.name = name
        self.fn = fn
        self.fix = fix


# id(reference) -> (reference, variants). The reference is kept so that its id stays unique.
_REGISTRY: dict = {}


def variant(of, name: str | None = None, fix: str = ""):
    """Register the decorated function as a variant of the reference `of`."""

    def register(fn):
        _REGISTRY.setdefault(id(of), (of, []))[1].append(Variant(name or fn.__name__, fn, fix))
        return fn

    return register


def variants_for(reference) -> list:
    """The variants registered for a reference (a function or an nn.Module class)."""
    entry = _REGISTRY.get(id(reference))
    return list(entry[1]) if entry and entry[0] is reference else []
