"""Deprecated alias of `kassay.ops.lse_merge.harness` (the harness moved into the op's folder): plugins and
artifacts written against `kassay.impls.lse_harness` keep working, with a DeprecationWarning."""

import warnings

from kassay.ops.lse_merge.harness import *  # noqa: F403
from kassay.ops.lse_merge.harness import __all__  # noqa: F401

warnings.warn(
    "kassay.impls.lse_harness moved to kassay.ops.lse_merge.harness; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
