"""Convergence: does a kernel's numerical difference matter for training?

A convergence group (a suite with `convergence:`) trains a small decoder (`model`) on a
synthetic language (`data`) with each impl in its op's place (the op folder's
`convergence_module`), against the baseline with matched seeds and beside a correct control
arm, and judges the held-out loss differences by equivalence (`stats`); `runner` runs it.
"""

from kassay.validate.convergence.runner import run_convergence

__all__ = ["run_convergence"]
