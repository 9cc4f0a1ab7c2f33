"""The CUDA probe's parent side (`gpuop.host.cuda.LibcudaProbe`): where it finds libcuda,
and that a libcuda that cannot load, crashes or hangs ends as a report, never as a hung or
crashed agent. (The real libcuda, without a GPU: tests/integration/host/test_real_libcuda.py.)"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from gpuop.host.cuda import CudaReport, LibcudaProbe, error_name, find_libcuda
from gpuop.host.roots import HostRoot

VERSION = "535.261.03"


def probe(library: Path, timeout: float = 10.0) -> CudaReport:
    return asyncio.run(
        LibcudaProbe(HostRoot(library.parent), library=library).probe(VERSION, timeout)
    )


def test_libcuda_is_found_in_the_versions_user_space_before_the_distributions_place(tmp_path):
    root = HostRoot(tmp_path)
    assert find_libcuda(root, VERSION) is None
    system = tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    system.parent.mkdir(parents=True)
    system.write_bytes(b"\x7fELF")
    assert find_libcuda(root, VERSION) == system
    ours = tmp_path / f"opt/gpuop/gpu/{VERSION}/lib/libcuda.so.1"
    ours.parent.mkdir(parents=True)
    ours.write_bytes(b"\x7fELF")
    assert find_libcuda(root, VERSION) == ours
    assert find_libcuda(root, "580.95.05") == system


def test_a_host_without_libcuda_fails_the_probe_naming_the_version(tmp_path):
    report = asyncio.run(LibcudaProbe(HostRoot(tmp_path)).probe(VERSION, 5))
    assert not report.ok and report.call == "dlopen"
    assert f"no libcuda.so.1 of driver {VERSION}" in report.describe()


def test_a_file_that_is_no_library_fails_at_dlopen_with_the_loaders_words(tmp_path):
    library = tmp_path / "libcuda.so.1"
    library.write_text("not an ELF file\n")
    report = probe(library)
    assert (report.call, report.error) == ("dlopen", -1)
    assert "invalid ELF header" in report.detail or "file too short" in report.detail


def test_a_hung_libcuda_is_killed_at_the_timeout(tmp_path):
    library = tmp_path / "libcuda.so.1"
    os.mkfifo(library)  # dlopen blocks opening a FIFO no one writes: a libcuda that hangs
    started = time.monotonic()
    report = probe(library, timeout=0.5)
    assert time.monotonic() - started < 5
    assert report.call == "timeout" and not report.ok
    assert "hung past 0.5 s; killed" in report.describe()


def test_cuda_errors_are_named_as_cuda_h_names_them():
    assert error_name(100) == "CUDA_ERROR_NO_DEVICE"
    assert error_name(3) == "CUDA_ERROR_NOT_INITIALIZED"
    assert error_name(7) == "CUDA error 7"
    report = CudaReport(devices=0, error=100, call="cuInit")
    assert report.describe() == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"
    assert CudaReport(devices=8).describe() == "a CUDA context on each of 8 GPUs"
