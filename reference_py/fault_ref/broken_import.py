"""A module whose import fails the way a missing dependency does."""

import a_dependency_that_is_not_installed  # noqa: F401


def fn(x):
    return x
