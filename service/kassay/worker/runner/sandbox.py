"""The sandbox of artifact code: how a worker starts the executor that loads a job's artifacts.

    python -m kassay.worker.runner.sandbox --config JSON -- PYTHON -m kassay.worker.executor.main ...
    python -m kassay.worker.runner.sandbox --probe          (prints what this host allows, as JSON)

Only the standard library is used (ctypes for the Linux calls); nothing here imports torch.

What the executor of an artifact set gets, layer by layer (each where the host allows it; the
worker's Describe reports which ones hold, `Sandbox`):

- a scrubbed environment (an allow-list: no tokens, no database URL, no KASSAY_* settings) and a
  fresh working directory, which is also its HOME and TMPDIR (the worker removes it afterwards);
- resource limits: CPU seconds, open files, processes/threads, private writable memory
  (RLIMIT_DATA: device memory is not counted), file size, no core dumps;
- Landlock (Linux 5.13+, any user): writes only beneath its working directory (and to the few
  character devices a GPU process needs); TCP connect/bind refused (ABI 4+); no signals to, and
  no abstract-socket connections with, processes outside the sandbox (ABI 6+); ptrace and
  /proc/PID/environ of the worker refused;
- as root: a new network namespace (no network at all but a loopback that is down) and, for a
  CPU executor, a new PID namespace (every process the code starts dies with the executor; CUDA
  does not initialise in a new PID namespace: error 304 on the H200, so a GPU executor keeps the
  host's PID namespace and its process group), and the code runs as an unprivileged
  user (`sandbox_uid`, default nobody) keeping only CAP_DAC_READ_SEARCH, so that it can read
  the worker's Python wherever it is installed while the process limit applies to it and the
  worker's processes are out of its reach.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- Linux constants

_SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture (new syscalls)
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

#: the rights a Landlock rule on a file (not a folder) may carry
_FILE_RIGHTS = 1 | (1 << 1) | (1 << 2) | (1 << 14)  # execute, write, read, truncate

#: character devices a GPU process opens for writing (besides /dev/null & co)
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "kfd")
_DEVICE_PREFIXES = ("nvidia",)
_DEVICE_DIRS = ("dri", "nvidia-caps")

#: environment variables passed to sandboxed code (nothing else is)
_ENV_KEEP = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "TERM",
    }
)
_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "OMP_", "MKL_", "TORCH_CUDA_ARCH")


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


# ------------------------------------------------------------------------------------ policy


@dataclass
class SandboxConfig:
    """What one sandboxed executor gets (travels to the launcher as JSON)."""

    workdir: str
    cpu_s: int = 3600
    nofile: int = 4096
    nproc: int = 512
    data_bytes: int = 0  # 0: no limit
    fsize_bytes: int = 4 << 30
    uid: int = 2_100_000_000  # used only when the worker is root
    namespaces: bool = True  # a new network namespace (root only)
    #: and a new PID namespace too (off for a GPU executor: CUDA fails with error 304 in one)
    pid_namespace: bool = True
    landlock: bool = True
    #: with Landlock, reads too: only Python's installation, `readable` (the artifacts' folders)
    #: and the system's libraries and devices
    restrict_reads: bool = True
    readable: list[str] = field(default_factory=list)
    #: folders it may write beside its working directory (the tensor exchange in /dev/shm)
    writable: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Capabilities:
    """What this host lets a sandbox do (the worker's Describe reports it)."""

    root: bool
    landlock_abi: int
    namespaces: bool
    notes: list[str] = field(default_factory=list)

    def describe(self, config: SandboxConfig) -> dict[str, Any]:
        """The kassay.v1.Sandbox fields (without `artifacts`)."""
        ns = self.namespaces and config.namespaces
        ll = self.landlock_abi if config.landlock else 0
        if ns:
            network = "namespace"
        elif ll >= 4:
            network = "landlock-tcp"
        else:
            network = "none"
        notes = list(self.notes)
        if network == "landlock-tcp":
            notes.append(
                "no network namespace (the worker is not root): TCP is refused by Landlock, "
                "UDP and Unix sockets are not"
            )
        elif network == "none":
            notes.append("network is NOT isolated: run the worker as root or on Linux 6.7+")
        if ll < 1:
            notes.append("writes are NOT confined (no Landlock): only file permissions apply")
        elif ll < 6:
            notes.append("Landlock ABI < 6: signals to the worker's other processes are allowed")
        pid_ns = ns and config.pid_namespace
        if ns and not config.pid_namespace:
            notes.append(
                "no PID namespace for a GPU executor (CUDA does not initialise in one): a "
                "process that leaves the executor's process group can outlive it"
            )
        elif not ns:
            notes.append(
                "no PID namespace: a process that leaves the executor's process group can "
                "outlive it"
            )
        if not (ll >= 1 and config.restrict_reads):
            notes.append(
                "reads are not confined: the code can read what the worker's user can read "
                "(keep secrets out of files on worker hosts; the environment is scrubbed)"
            )
        notes.append(
            "the code runs apart from the executor that judges it: it hands back outputs, "
            "timing and memory only; its own timing and memory can be what it says"
        )
        return {
            "network": network,
            "filesystem": "landlock" if ll >= 1 else "none",
            "processes": "pid-namespace" if pid_ns else "process-group",
            "user": (
                f"uid {config.uid} and up, one per sandbox (keeps CAP_DAC_READ_SEARCH only)"
                if self.root
                else "the worker's user"
            ),
            "limits": {
                "cpu_s": config.cpu_s,
                "nofile": config.nofile,
                "nproc": config.nproc,
                "data_bytes": config.data_bytes,
                "fsize_bytes": config.fsize_bytes,
            },
            "notes": notes,
        }


#: shared memory for the tensor exchange, used where it has this much room
SHM_ROOT = "/dev/shm"
SHM_MIN_FREE = 1 << 30


def exchange_dir(workdir: str) -> str:
    """Where a sandbox with working directory `workdir` trades tensor files with the trusted
    executor: a folder of /dev/shm named after it (shared memory, no disk) where that has
    SHM_MIN_FREE bytes free, else the working directory. The worker removes both afterwards."""
    try:
        st = os.statvfs(SHM_ROOT)
    except OSError:
        return workdir
    if st.f_bavail * st.f_frsize < SHM_MIN_FREE or not os.access(SHM_ROOT, os.W_OK):
        return workdir
    return os.path.join(SHM_ROOT, os.path.basename(os.path.normpath(workdir)))


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (0: none)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return max(0, int(_libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)))
    except (OSError, AttributeError):
        return 0


def probe() -> Capabilities:
    """What the sandbox can do here: Landlock's ABI, and (root) whether namespaces work (tried
    in a child, which exits at once)."""
    root = sys.platform.startswith("linux") and os.geteuid() == 0
    namespaces = False
    if root:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                _check(_libc().unshare(_CLONE_NEWNET | _CLONE_NEWPID), "unshare")
            except OSError:
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        namespaces = os.waitstatus_to_exitcode(status) == 0
    return Capabilities(root=root, landlock_abi=landlock_abi(), namespaces=namespaces)


def scrubbed_env(env: dict[str, str], workdir: str) -> dict[str, str]:
    """The environment sandboxed code gets: the allow-list above, and its working directory as
    HOME, TMPDIR and every cache directory."""
    out = {k: v for k, v in env.items() if k in _ENV_KEEP or k.startswith(_ENV_PREFIXES)}
    out.update(
        HOME=workdir,
        TMPDIR=workdir,
        XDG_CACHE_HOME=os.path.join(workdir, ".cache"),
        TRITON_CACHE_DIR=os.path.join(workdir, ".triton"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, ".inductor"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    return out


# ---------------------------------------------------------------------------------- landlock


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _device_paths() -> list[str]:
    paths = [f"/dev/{d}" for d in _DEVICES]
    with contextlib.suppress(OSError):
        paths += [f"/dev/{n}" for n in os.listdir("/dev") if n.startswith(_DEVICE_PREFIXES)]
    for d in _DEVICE_DIRS:
        with contextlib.suppress(OSError):
            paths += [f"/dev/{d}/{n}" for n in os.listdir(f"/dev/{d}")]
    return [p for p in paths if os.path.exists(p) and not os.path.isdir(p)]


#: system files and folders a Python process with torch (and CUDA) reads; /etc only in part
_SYSTEM_READABLE = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/opt",
    "/proc",
    "/sys",
    "/dev",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/os-release",
    "/etc/ssl",
    "/etc/pki",
    "/etc/alternatives",
    "/etc/OpenCL",
    "/etc/vulkan",
    "/etc/glvnd",
)


def python_readable() -> list[str]:
    """What this Python needs to read: its installation (prefixes, the real executable's
    folder), every folder on sys.path except the current directory (the worker's, where a
    service may keep its data), and wherever the installed packages really are
    (`installed_code()`: an editable install's source folder is on no sys.path entry)."""
    cwd = os.path.realpath(os.getcwd())
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    for entry in sys.path:
        if entry and os.path.exists(entry) and os.path.realpath(entry) != cwd:
            paths.add(entry)
    paths.update(installed_code(cwd))
    real = sorted({os.path.realpath(p) for p in paths if p})
    # one rule per tree: what lies beneath a folder already readable needs none of its own
    kept: list[str] = []
    for path in real:
        if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _top_level_names(dist: Any) -> set[str]:
    """The import names a distribution provides: its top_level.txt, else the first parts of
    the files it installed, plus the modules its entry points name (a plugin's, whatever
    backend built it)."""
    names: set[str] = set()
    top = dist.read_text("top_level.txt")
    if top:
        names.update(top.split())
    else:
        for f in dist.files or []:
            parts = f.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(".dist-info"):
                continue
            if len(parts) > 1:
                names.add(parts[0])
            elif parts[0].endswith(".py"):
                names.add(parts[0][:-3])
    for ep in dist.entry_points:
        names.add(ep.module.split(".")[0])
    return {n for n in names if n.isidentifier()}


def installed_code(cwd: str) -> set[str]:
    """Where the installed distributions' top-level packages and modules are, as the import
    system finds them (editable finders and .pth hooks resolved): each package's own folder
    (or a module's file), never its parent. What only the current directory provides is left
    out: `python -m` puts it first on sys.path, and it is the service's, not an install."""
    from importlib import machinery, metadata, util

    names: set[str] = set()
    for dist in metadata.distributions():
        try:
            names |= _top_level_names(dist)
        except Exception:  # a broken dist-info must not keep the sandbox from starting
            continue
    found: set[str] = set()
    for name in names:
        try:
            # sys.path's own finder first: a meta-path hook may act on being asked
            # (setuptools' distutils hack turns itself off for the process when asked for
            # `pip`); the hooks are asked only for what sys.path lacks (editable finders)
            spec = machinery.PathFinder.find_spec(name) or util.find_spec(name)
        except Exception:  # an import hook that raises: nothing to add for it
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            where = [str(p) for p in spec.submodule_search_locations]
        elif spec.has_location and spec.origin:
            where = [spec.origin]
        else:
            continue
        for path in where:
            real = os.path.realpath(path)
            if os.path.dirname(real) != cwd and real != cwd and os.path.exists(real):
                found.add(real)
    return found


def apply_landlock(writable: list[str], abi: int, readable: list[str] | None = None) -> None:
    """Restrict this process (and what it executes) to writing beneath `writable`, with no TCP
    (ABI 4+) and no signals or abstract sockets beyond itself (ABI 6+). With `readable`, reads
    too: only beneath those, `writable` and the system's libraries and devices
    (_SYSTEM_READABLE): not the service's data, logs or settings, nor /etc/shadow, whatever
    the process's capabilities (Landlock applies on top of them)."""
    libc = _libc()
    reads = _FS_READ_FILE | _FS_READ_DIR if readable is not None else 0
    fs = (
        reads
        | _FS_WRITE_FILE
        | _FS_REMOVE_DIR
        | _FS_REMOVE_FILE
        | _FS_MAKE_CHAR
        | _FS_MAKE_DIR
        | _FS_MAKE_REG
        | _FS_MAKE_SOCK
        | _FS_MAKE_FIFO
        | _FS_MAKE_BLOCK
        | _FS_MAKE_SYM
    )
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    attr = _RulesetAttr(fs, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    ruleset = _check(
        libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0), "landlock"
    )
    file_rights = _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
    try:
        rules = [(path, fs) for path in writable]
        if readable is not None:
            rules += [
                (path, _FS_READ_FILE | _FS_READ_DIR) for path in (*readable, *_SYSTEM_READABLE)
            ]
        rules += [(path, file_rights) for path in _device_paths()]
        rules.append((f"/proc/{os.getpid()}", file_rights))  # thread names and the like
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            if not os.path.isdir(path):  # a file's rule takes file rights only
                rights &= _FILE_RIGHTS
            try:
                rule = _PathBeneathAttr(rights, fd)
                _check(
                    libc.syscall(
                        _SYS_LANDLOCK_ADD_RULE,
                        ruleset,
                        _LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule),
                        0,
                    ),
                    f"landlock rule for {path}",
                )
            finally:
                os.close(fd)
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


# ------------------------------------------------------------------------- user and limits


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_to_user(uid: int) -> None:
    """Root only: become `uid` keeping nothing but CAP_DAC_READ_SEARCH (so the worker's Python
    stays readable wherever it lives), also across exec (an ambient capability)."""
    libc = _libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap != _CAP_DAC_READ_SEARCH:
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails harmlessly for absent caps
    _check(libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "keepcaps")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (_CapData * 2)(_CapData(bit, bit, bit), _CapData(0, 0, 0))
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0), "ambient"
    )


def _uid_tasks(uid: int) -> int:
    """Threads now running as `uid` (RLIMIT_NPROC counts them all, not only ours)."""
    n = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            n += int(fields.get("Threads", "1").strip())
    return n


def set_limits(cfg: SandboxConfig, *, own_uid: bool) -> None:
    """The resource limits (soft = hard, except CPU: SIGXCPU first, SIGKILL 5 s later).
    `own_uid`: the code runs as the worker's user, whose other threads count against the
    process limit too."""
    import resource

    def cap(which: int, value: int, hard: int | None = None) -> None:
        _, old_hard = resource.getrlimit(which)
        hard = value if hard is None else hard
        if old_hard != resource.RLIM_INFINITY:
            value, hard = min(value, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (value, hard))

    cap(resource.RLIMIT_CPU, cfg.cpu_s, cfg.cpu_s + 5)
    cap(resource.RLIMIT_NOFILE, cfg.nofile)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_FSIZE, cfg.fsize_bytes)
    nproc = cfg.nproc + (_uid_tasks(os.getuid()) if own_uid else 0)
    cap(resource.RLIMIT_NPROC, nproc)
    if cfg.data_bytes:
        cap(resource.RLIMIT_DATA, cfg.data_bytes)


# ---------------------------------------------------------------------------------- launcher


def _to_devnull(fds: tuple[int, ...]) -> None:
    """Let go of the executor's pipes (its end of the protocol must close when it dies)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(null, fd)
    os.close(null)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _exec_confined(cfg: SandboxConfig, argv: list[str], *, root: bool, abi: int) -> None:
    """In the process that becomes the executor: limits, user, Landlock, then exec."""
    os.chdir(cfg.workdir)
    set_limits(cfg, own_uid=not root)
    if root:
        drop_to_user(cfg.uid)
    if cfg.landlock and abi >= 1:
        apply_landlock(
            [cfg.workdir, *cfg.writable], abi, cfg.readable if cfg.restrict_reads else None
        )
    env = scrubbed_env(dict(os.environ), cfg.workdir)
    os.execve(argv[0], argv, env)


def _status_code(status: int) -> int:
    """An exit status as a code: the exit code, or 128 + the signal that killed it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _init(cfg: SandboxConfig, argv: list[str], abi: int) -> int:
    """PID 1 of the sandbox's namespace: start the executor, reap whatever else ends, and return
    the executor's status. Everything left in the namespace dies when this returns."""
    _die_with_parent()
    pid = os.fork()
    if pid == 0:
        try:
            _exec_confined(cfg, argv, root=True, abi=abi)
        except BaseException as exc:  # pragma: no cover - reported through stderr
            print(f"kassay sandbox: cannot start the executor: {exc}", file=sys.stderr)
        os._exit(126)
    _to_devnull((0, 1))
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if done == pid:
            return _status_code(status)


def launch(cfg: SandboxConfig, argv: list[str]) -> int:
    """Run `argv` (the executor) in the sandbox; returns only where it cannot exec in place."""
    _die_with_parent()
    if cfg.restrict_reads:  # before anything changes the current directory
        from dataclasses import replace

        cfg = replace(cfg, readable=[*python_readable(), *cfg.readable])
    root = os.geteuid() == 0
    abi = landlock_abi() if cfg.landlock else 0
    if root and cfg.namespaces:
        flags = _CLONE_NEWNET | (_CLONE_NEWPID if cfg.pid_namespace else 0)
        try:
            _check(_libc().unshare(flags), "unshare")
        except OSError as exc:
            print(f"kassay sandbox: no namespaces ({exc}); going on without", file=sys.stderr)
        else:
            if cfg.pid_namespace:  # the namespace takes effect for children: fork its init
                child = os.fork()
                if child == 0:
                    os._exit(_init(cfg, argv, abi))
                _to_devnull((0, 1))
                _, status = os.waitpid(child, 0)
                code = _status_code(status)
                if 128 < code < 128 + 65:  # the executor died of a signal: die of it too
                    signal.signal(code - 128, signal.SIG_DFL)
                    os.kill(os.getpid(), code - 128)
                return code
    _exec_confined(cfg, argv, root=root, abi=abi)
    return 126  # pragma: no cover - execve does not return


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1 :]
    parser = argparse.ArgumentParser(prog="python -m kassay.worker.runner.sandbox")
    parser.add_argument("--config", help="SandboxConfig as JSON")
    parser.add_argument("--probe", action="store_true", help="print what this host allows")
    opts = parser.parse_args(args)
    if opts.probe:
        print(json.dumps(asdict(probe())))
        return 0
    if not opts.config or not command:
        parser.error("--config JSON -- COMMAND... is required")
    return launch(SandboxConfig(**json.loads(opts.config)), command)


if __name__ == "__main__":
    sys.exit(main())
