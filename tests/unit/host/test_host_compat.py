"""Kernel compatibility patches: applied only where the kernel has the changed API and the
source still calls the old one; a failed compile said in one paragraph."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.host import building, compat

OLD_CALL = "    r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);\n"
NEW_HEADER = (
    "int __must_check pci_resize_resource(struct pci_dev *dev, int i, int size,\n"
    "\t\t\t\t     int exclude_bars);\n"
)
OLD_HEADER = "int __must_check pci_resize_resource(struct pci_dev *dev, int i, int size);\n"


def _trees(tmp_path: Path, header: str, source: str) -> tuple[Path, Path]:
    headers, modules = tmp_path / "headers", tmp_path / "modules"
    (headers / "include/linux").mkdir(parents=True)
    (headers / "include/linux/pci.h").write_text(header)
    (modules / "nvidia").mkdir(parents=True)
    (modules / "nvidia/nv-pci.c").write_text(source)
    return modules, headers


def test_a_kernel_with_exclude_bars_gets_the_fourth_argument(tmp_path: Path) -> None:
    modules, headers = _trees(tmp_path, NEW_HEADER, OLD_CALL)
    assert compat.apply(modules, headers) == ["pci-resize-resource-exclude-bars"]
    patched = (modules / "nvidia/nv-pci.c").read_text()
    assert patched == "    r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0);\n"
    assert compat.apply(modules, headers) == [], "a patched source is not patched twice"


@pytest.mark.parametrize(
    ("header", "source"),
    [
        (OLD_HEADER, OLD_CALL),  # the kernel still has the three-argument API
        (NEW_HEADER, "    r = pci_resize_resource(pci_dev, BAR1, size, 0);\n"),  # a fixed driver
        (NEW_HEADER, "/* no BAR resizing in this driver */\n"),
    ],
    ids=["old-kernel", "driver-already-fits", "no-call"],
)
def test_nothing_is_patched_where_it_does_not_apply(
    tmp_path: Path, header: str, source: str
) -> None:
    modules, headers = _trees(tmp_path, header, source)
    assert compat.apply(modules, headers) == []
    assert (modules / "nvidia/nv-pci.c").read_text() == source


GCC_LOG = """\
  CC [M]  nvidia/nv-pci.o
nvidia/nv-pci.c: In function 'nv_resize_pcie_bars':
nvidia/nv-pci.c:223:9: error: too few arguments to function 'pci_resize_resource'
  223 |     r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
make[2]: *** [scripts/Makefile.build:250: nvidia/nv-pci.o] Error 1
"""


def test_a_failed_compile_is_one_paragraph_naming_file_api_and_log(tmp_path: Path) -> None:
    log = tmp_path / "modules.log"
    said = compat.diagnose(GCC_LOG, driver="535.261.03", kernel="6.1.0-57-amd64", log_path=log)
    assert said is not None and "\n" not in said
    assert "nvidia/nv-pci.c:223" in said
    assert "`pci_resize_resource()`" in said
    assert "6.1.0-57-amd64" in said and str(log) in said
    assert compat.diagnose("make: *** No rule", driver="x", kernel="y", log_path=log) is None


def test_compile_modules_raises_the_paragraph_instead_of_the_make_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules, headers_tree = _trees(tmp_path, OLD_HEADER, OLD_CALL)
    (modules / "Makefile").write_text("modules:\n\tfalse\n")
    work = tmp_path / "work"
    work.mkdir()

    def failing_make(build: Path, headers: object, prefix: str, jobs: int, log: Path) -> None:
        log.write_text(GCC_LOG)
        raise building.BuildError("make -j2 modules failed (2): ...300 lines...")

    monkeypatch.setattr(building, "_make_modules", failing_make)
    tree = building.DriverTree("535.261.03", modules)
    kernel = building.KernelHeaders("6.1.0-57-amd64", headers_tree, headers_tree)
    with pytest.raises(building.BuildError) as failed:
        building.compile_modules(tree, kernel, work, jobs=2)
    assert str(failed.value).startswith("NVIDIA's 535.261.03 modules do not compile")
    assert str(work / "modules.log") in str(failed.value)
