"""The mutant corpus: one deliberately wrong impl per known real-world bug (TARGETS.md,
"Known bugs the service must catch"). `kassay selftest` runs them and the correct impls over
grids chosen to expose each bug; the default policies must flag every mutant and none of the
correct impls. Registered with kind="mutant": never offered to ordinary jobs unless asked for.
"""

from kassay.impls.mutants import flce as flce
from kassay.impls.mutants import lse_merge as lse_merge
