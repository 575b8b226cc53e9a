"""The file transport between the trusted executor and the impl runner (a CPU worker's): what
the runner maps is copy-on-write, what the executor takes is its own copy, and a header that
names anything but a tensor file of the right size is refused before a byte is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kassay.worker.exchange.tensor_files import TensorFileError
from kassay.worker.exchange.transports import FileExchange
from kassay.worker.runner import sandbox

CPU = torch.device("cpu")


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(3, 5, generator=g),
        "h": torch.randn(4, dtype=torch.float64, generator=g).to(torch.bfloat16),
        "idx": torch.arange(7),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
    }


def test_tensors_cross_both_ways_bit_for_bit(tmp_path: Path) -> None:
    trusted, runner = FileExchange(str(tmp_path), CPU), FileExchange(str(tmp_path), CPU)
    sent = _tensors()
    headers = trusted.lend(sent, "in1")
    got = runner.take_views(headers)
    for k, t in sent.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    back = runner.lend({"y": got["x"] * 2}, "c1-out")
    outs = trusted.take_copies(back, max_bytes=1 << 20)
    assert torch.equal(outs["y"], sent["x"] * 2)
    runner.release_lent()
    trusted.release_lent()
    assert os.listdir(tmp_path) == []  # every file was removed by the side that lent it


def test_the_runner_writing_into_its_inputs_changes_nothing_lent(tmp_path: Path) -> None:
    trusted, runner = FileExchange(str(tmp_path), CPU), FileExchange(str(tmp_path), CPU)
    sent = {"x": torch.ones(64)}
    headers = trusted.lend(sent, "in1")
    view = runner.take_views(headers)["x"]
    view.fill_(7.0)  # the impl scribbles on its inputs
    assert torch.equal(runner.take_views(headers)["x"], torch.ones(64))
    assert torch.equal(sent["x"], torch.ones(64))


def test_what_the_executor_takes_is_its_own_copy(tmp_path: Path) -> None:
    trusted, runner = FileExchange(str(tmp_path), CPU), FileExchange(str(tmp_path), CPU)
    headers = runner.lend({"y": torch.zeros(16)}, "c1-out")
    path = tmp_path / headers["y"]["file"]
    data = path.read_bytes()
    outs = trusted.take_copies(headers, max_bytes=1 << 20)
    assert not path.exists()  # taken: the file is gone
    path.write_bytes(b"\xff" * len(data))  # the runner writes afterwards
    assert torch.equal(outs["y"], torch.zeros(16))


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"file": "../x.bin", "dtype": "float32", "shape": [4]}, "plain file name"),
        ({"file": ".hidden", "dtype": "float32", "shape": [4]}, "plain file name"),
        ({"file": "a.bin", "dtype": "object", "shape": [4]}, "dtype"),
        ({"file": "a.bin", "dtype": "float32", "shape": [5]}, "the header says 20"),
        ({"file": "a.bin", "dtype": "float32", "shape": [-1]}, "non-negative"),
        ({"file": "a.bin", "dtype": "float32", "shape": [1 << 40]}, "over the"),
        ({"file": "a.bin", "dtype": "float32"}, "exactly"),
        ({"file": "link.bin", "dtype": "float32", "shape": [4]}, "Too many levels"),
        ({"file": "hard.bin", "dtype": "float32", "shape": [4]}, "of its own"),
    ],
)
def test_headers_naming_anything_else_are_refused(tmp_path: Path, header: dict, why: str) -> None:
    (tmp_path / "a.bin").write_bytes(b"\0" * 16)
    (tmp_path / "link.bin").symlink_to(tmp_path / "a.bin")
    (tmp_path / "b.bin").write_bytes(b"\0" * 16)
    os.link(tmp_path / "b.bin", tmp_path / "hard.bin")
    ex = FileExchange(str(tmp_path), CPU)
    with pytest.raises(TensorFileError, match=why):
        ex.take_copies({"t": header}, max_bytes=1 << 20)


def test_too_many_bytes_together_are_refused(tmp_path: Path) -> None:
    runner, trusted = FileExchange(str(tmp_path), CPU), FileExchange(str(tmp_path), CPU)
    headers = runner.lend({"a": torch.zeros(100), "b": torch.zeros(100)}, "c1-out")
    with pytest.raises(TensorFileError, match="over the"):
        trusted.take_copies(headers, max_bytes=600)


def test_the_exchange_is_shared_memory_where_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = str(tmp_path / "kassay-sandbox-abc")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(sandbox, "SHM_ROOT", str(shm))
    monkeypatch.setattr(sandbox, "SHM_MIN_FREE", 1)
    assert sandbox.exchange_dir(workdir) == str(shm / "kassay-sandbox-abc")
    monkeypatch.setattr(sandbox, "SHM_MIN_FREE", 1 << 62)  # no room: the working directory
    assert sandbox.exchange_dir(workdir) == workdir
    monkeypatch.setattr(sandbox, "SHM_ROOT", str(tmp_path / "none"))
    assert sandbox.exchange_dir(workdir) == workdir
