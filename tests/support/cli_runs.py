"""What the tests of `gpuop` commands against the simulated API server share: running the
CLI in a thread with its output captured, a GPU node with its kernel, and a format-2 driver
package in a source directory."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path
from typing import Any

from gpuop.cli.main import main
from gpuop.events.driver import Flavour
from gpuop.host import manifests, packaging, signing
from gpuop.policy import specs
from tests.support.kernel_modules import module_elf

DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"


async def cli(*argv: str) -> tuple[int, str, str]:
    """`gpuop argv...`: its exit code, standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                return main(list(argv))
            except SystemExit as exit:
                return int(exit.code or 0)

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()


def gpu_node(name: str, kernel: str, driver: str, **labels: str) -> dict[str, Any]:
    """A Ready GPU node running `driver` on `kernel`."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true", DRIVER_LABEL: driver, **labels},
        },
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kernelVersion": kernel},
        },
    }


def add_package(
    source: Path,
    version: str,
    flavour: Flavour,
    kernel: str,
    key: signing.SecretKey | None = None,
) -> None:
    """A format-2 GPU driver package of `version` with the `flavour` modules for `kernel`,
    added to `source`'s index (signed with `key`, else unsigned)."""
    license_ = "Dual MIT/GPL" if flavour is Flavour.OPEN else "NVIDIA"
    module = module_elf("nvidia", f"{kernel} SMP mod_unload ", version=version, license=license_)
    built = packaging.write_package_v2(
        source,
        component="gpu",
        version=version,
        flavour=flavour,
        kernel_release=kernel,
        files={"modules/nvidia.ko": packaging.PackageContent(module, manifests.Role.MODULE)},
    )
    packaging.add_to_index(source, built, key)


def policy_object(spec: dict[str, Any]) -> dict[str, Any]:
    """The GPUClusterPolicy `default` with `spec`, as `kubectl apply` would send it."""
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": spec,
    }
