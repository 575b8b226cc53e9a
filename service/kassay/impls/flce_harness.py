"""Deprecated alias of `kassay.ops.flce.harness` (the harness moved into the op's folder): plugins and
artifacts written against `kassay.impls.flce_harness` keep working, with a DeprecationWarning."""

import warnings

from kassay.ops.flce.harness import *  # noqa: F403
from kassay.ops.flce.harness import __all__  # noqa: F401

warnings.warn(
    "kassay.impls.flce_harness moved to kassay.ops.flce.harness; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
