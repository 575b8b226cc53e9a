"""The fairness corpus: correct impls written differently from eager PyTorch (other softmax
formulas, float32 logits under 16-bit inputs, float64, chunked and compensated sums). `kassay
selftest` runs them beside the mutant corpus under plain specs: none may fail. Registered with
kind "alternative": offered only where mutants are.
"""

from kassay.impls.alternatives import flce as flce
from kassay.impls.alternatives import lse_merge as lse_merge
