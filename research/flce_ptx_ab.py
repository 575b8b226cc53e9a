"""Does kassay's CE kernel compile to the same code with its options off? (runs on a CPU)

Compiles `_ce_rows_kernel` of the working tree (options left at their defaults: None pointers,
False constexprs) and of a base version of `_flce_kernels.py` for sm_90 (Triton's own compiler,
no GPU needed) over every default specialisation (16-bit/float32 logits, softcap, label
smoothing, gradient pass) and compares the PTX instructions (debug sections and line info
dropped). Identical PTX: the default path's speed cannot have changed.

    git show main:service/kassay/kernels/_flce_kernels.py > /tmp/base_kernels.py
    python3 research/flce_ptx_ab.py --base /tmp/base_kernels.py
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

NEW = Path(__file__).resolve().parents[1] / "service/kassay/kernels/_flce_kernels.py"
RUNTIME = {
    "z_ptr": None, "stride_z": "i32", "tgt_ptr": "*i64", "loss_ptr": "*fp32",
    "zloss_ptr": "*fp32", "lse_ptr": "*fp32", "scale_ptr": "*fp32", "stride_scale": "i32",
    "V": "i32", "ignore_index": "i32", "label_smoothing": "fp32", "z_loss_scale": "fp32",
    "softcap": "fp32", "n_rows": "i32", "row_step": "i32",
}  # fmt: skip


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ptx(mod, zdt: str, softcap: bool, ls: bool, grad: bool) -> list[str]:
    fn = mod._ce_rows_kernel
    params = inspect.signature(fn.fn).parameters
    sig = {k: (f"*{zdt}" if k == "z_ptr" else v) for k, v in RUNTIME.items()}
    const = {"HAS_SOFTCAP": softcap, "HAS_LS": ls, "COMPUTE_GRAD": grad, "BLOCK_V": 8192}
    const.update(PAIR=True, HINTS=True)
    for k, p in params.items():  # options the base may not have: their defaults / None
        if k not in sig and k not in const:
            const[k] = None if p.default is inspect.Parameter.empty else p.default
    sig.update(dict.fromkeys(const, "constexpr"))
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()}
    )
    asm = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 32}).asm
    body = asm["ptx"].split(".section\t.debug")[0]
    strip = re.compile(r"(//.*|\.file.*|\.loc.*|_ce_rows_kernel)")
    return [s for s in (strip.sub("", line).strip() for line in body.splitlines()) if s]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base version's _flce_kernels.py")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles the kernels")
    base, new = _load(Path(args.base), "base_kernels"), _load(NEW, "new_kernels")
    same = True
    for zdt in ("bf16", "fp16", "fp32"):
        for softcap in (False, True):
            for ls in (False, True):
                for grad in (True, False):
                    a, b = ptx(base, zdt, softcap, ls, grad), ptx(new, zdt, softcap, ls, grad)
                    ok = a == b
                    same &= ok
                    print(f"{zdt} softcap={softcap} ls={ls} grad={grad}: "
                          f"{'identical' if ok else 'DIFFERENT'} ({len(a)} / {len(b)} lines)")  # fmt: skip
    print("default specialisations: identical PTX" if same else "PTX differs")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
