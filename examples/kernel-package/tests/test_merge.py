"""The kernel's own tests, as a kernel repository writes them: kassay's verdict (float64
reference, the baseline's error, the op's edge regimes) instead of hand-tuned atol/rtol.

    pip install -e . && pytest tests/                      # CPU: Triton's interpreter
    pytest tests/ --kassay-report kassay.json              # + the report kassay run would give
"""

from kassay_example_kernels.merge import merge_states

import kassay.testing as kt


def merge(outs, lses, *, lse_layout, accumulate):  # lse_merge's calling convention
    return merge_states(outs, lses, lse_layout=lse_layout)


# every default regime of the op (empty rows, FlashAttention-2's +inf, huge lses), float32 and
# float16 (bfloat16 under the CPU interpreter is skipped, saying why)
@kt.parametrize("lse_merge", T=64, Hh=4, D=32, K=[2, 4], dtype=["float32", "float16"])
def test_merge_states(case):
    kt.assert_kernel("lse_merge", merge, case)


def test_the_installed_impl_is_the_same_kernel(kassay):
    # the name its kassay.impls entry point registers: what a job's `impls:` lists
    kassay.assert_kernel("lse_merge", "example_merge", T=64, Hh=4, D=32, K=3, dtype="float32")
