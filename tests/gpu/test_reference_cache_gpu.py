"""The reference cache on CUDA: references kept page-locked (cudaHostRegister) come back to the
device intact and faster than from pageable memory; a refused lock leaves no CUDA error behind
for the next kernel launch; the lock goes with the cached copy."""

import gc
import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEV = torch.device("cuda")


def _hit_seconds(page_lock: bool) -> tuple[float, bool]:
    from kassay.validate.reference_cache import ReferenceCache

    cache = ReferenceCache(cap_bytes=8 << 30, page_lock=page_lock)
    x = torch.randn(64, 1 << 20, device=DEV)  # 256 MiB of float32 inputs
    make = lambda: {"x": x}  # noqa: E731
    ref = lambda ins: {"y": ins["x"].double() * 2}  # 512 MiB of float64 reference  # noqa: E731
    _, first, hit = cache.get_or_make("k", DEV, make, ref)
    assert not hit
    ((_fp, host, _size),) = cache._entries.values()
    locked = host["y"].is_pinned()
    cache.get_or_make("k", DEV, make, ref)  # one untimed hit
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    _, again, hit = cache.get_or_make("k", DEV, make, ref)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    assert hit and torch.equal(again["y"], first["y"])
    return took, locked


def test_page_locked_references_copy_back_faster_and_intact() -> None:
    locked_s, locked = _hit_seconds(page_lock=True)
    pageable_s, pageable_locked = _hit_seconds(page_lock=False)
    assert locked and not pageable_locked
    # H200: 0.08 s against 0.50 s for 3.9 GiB (research/NOTES-probes.md (host_copy_probe)); 2x is a floor
    assert locked_s < pageable_s / 2, (locked_s, pageable_s)


def test_a_refused_lock_leaves_no_error_for_the_next_launch() -> None:
    """Locking memory twice is refused (cudaErrorHostMemoryAlreadyRegistered); without clearing
    the runtime's last error, the next kernel launch raised it (research/NOTES-probes.md (cudart_error_probe))."""
    from kassay.validate.reference_cache import _page_lock

    host = torch.empty(1 << 20, dtype=torch.float64)
    assert _page_lock(host) and host.is_pinned()
    assert not _page_lock(host)
    assert torch.randn(16, device=DEV).abs().sum().item() > 0


def test_the_lock_goes_with_the_cached_copy() -> None:
    """When the cached tensor is freed its pages are unlocked: memory kept alive through its
    storage (not a view, which keeps the tensor itself alive) can then be locked again, which
    it could not while locked."""
    from kassay.validate.reference_cache import _page_lock

    host = torch.empty(1 << 20, dtype=torch.float64)
    storage = host.untyped_storage()
    assert _page_lock(host)
    again = torch.empty(0, dtype=torch.float64).set_(storage)
    assert not _page_lock(again)
    del host
    gc.collect()
    assert not again.is_pinned()
    assert _page_lock(again)
    assert torch.randn(16, device=DEV).abs().sum().item() > 0
