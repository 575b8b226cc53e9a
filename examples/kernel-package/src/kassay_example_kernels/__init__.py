"""An example kernel package: `merge_states`, a Triton K-way merge of attention states."""

from kassay_example_kernels.merge import merge_states

__all__ = ["merge_states"]
