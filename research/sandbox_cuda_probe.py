"""Which sandbox layer keeps CUDA from initialising? Runs `torch.cuda.is_available()` under
kassay.worker.sandbox with each combination of namespaces and Landlock (as root the launcher
always drops to nobody). Usage: python research/sandbox_cuda_probe.py"""

import itertools
import json
import os
import subprocess
import sys
import tempfile

from kassay.worker.sandbox import SandboxConfig

CHECK = (
    "import torch,os;ok=torch.cuda.is_available();"
    "print('uid',os.getuid(),'cuda',ok, torch.zeros(1,device='cuda').item() if ok else '')"
)


def main() -> None:
    print(
        "euid",
        os.geteuid(),
        subprocess.run(["ls", "-l", "/dev"], capture_output=True, text=True).stdout[-1500:],
    )
    print(
        subprocess.run(
            [sys.executable, "-m", "kassay.worker.sandbox", "--probe"],
            capture_output=True,
            text=True,
        ).stdout
    )
    for ns, ll in itertools.product([False, True], [False, True]):
        with tempfile.TemporaryDirectory() as wd:
            os.chmod(wd, 0o777)
            cfg = SandboxConfig(workdir=wd, namespaces=ns, landlock=ll)
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kassay.worker.sandbox",
                    "--config",
                    json.dumps(cfg.__dict__),
                    "--",
                    sys.executable,
                    "-c",
                    CHECK,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
            print(f"namespaces={ns} landlock={ll} rc={r.returncode}", *tail, sep="\n  ")

    # Which namespace is it? Each alone, as root, no Landlock, no user change.
    CLONE = {"net": 0x40000000, "pid": 0x20000000}
    for name, flag in CLONE.items():
        pid = os.fork()
        if pid == 0:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(flag) != 0:
                os._exit(3)
            inner = os.fork()  # a new PID namespace takes effect for children
            if inner == 0:
                os.execv(sys.executable, [sys.executable, "-c", CHECK])
            _, st = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(st))
        _, st = os.waitpid(pid, 0)
        print(f"unshare {name} only: rc={os.waitstatus_to_exitcode(st)}", flush=True)


if __name__ == "__main__":
    main()
