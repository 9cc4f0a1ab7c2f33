"""Container runtime configuration and CDI specs on a host root, as a node has them: the
main configs Debian and the runtimes ship, the drop-ins that add the `nvidia` handler (the
formats the driver-manager writes, written here by hand so discovery's readers are tested
against the formats, not against the writer), and CDI specs of kind `nvidia.com/gpu`."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

CONTAINERD_MAIN_V2 = """\
version = 2
imports = ["/etc/containerd/conf.d/*.toml"]

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
"""Debian's containerd 1.6 main config with the import line the drop-in needs."""

CONTAINERD_DROP_IN_V2 = """\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
"""A version 2 drop-in: the whole CRI table again (containerd 1.x replaces it) plus `nvidia`."""

CONTAINERD_MAIN_V3 = """\
version = 3
imports = ["conf.d/*.toml"]
"""
CONTAINERD_DROP_IN_V3 = """\
version = 3
[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
CRIO_MAIN = """\
[crio.runtime]
default_runtime = "crun"
[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
"""
CRIO_DROP_IN = """\
[crio.runtime]
cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
[crio.runtime.runtimes.nvidia]
runtime_path = "/usr/bin/crun"
runtime_type = "oci"
"""
DPKG_CONTAINERD = """\
Package: containerd
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 1.6.20~ds1-1+deb12u3
Description: daemon to control runC
 containerd is a daemon to control runC.
"""

CONTAINERD_MAIN = "etc/containerd/config.toml"
CONTAINERD_DROP_IN = "etc/containerd/conf.d/99-nvidia.toml"
CRIO_MAIN_PATH = "etc/crio/crio.conf"
CRIO_DROP_IN_PATH = "etc/crio/crio.conf.d/99-nvidia.conf"
SPEC = "var/run/cdi/nvidia.com-gpu.json"


def write(root: HostRoot, relative: str, text: str) -> Path:
    """`text` at `relative` under the root, written atomically as the driver-manager does."""
    path = root.join(relative)
    write_atomic(path, text)
    return path


def containerd_with_handler(root: HostRoot, *, version: int = 2) -> None:
    """A containerd node configured for NVIDIA: the main config importing the drop-in."""
    main, drop_in = (
        (CONTAINERD_MAIN_V2, CONTAINERD_DROP_IN_V2)
        if version == 2
        else (CONTAINERD_MAIN_V3, CONTAINERD_DROP_IN_V3)
    )
    write(root, CONTAINERD_MAIN, main)
    write(root, CONTAINERD_DROP_IN, drop_in)


def spec_document(
    gpus: int = 2, *, kind: str = "nvidia.com/gpu", cdi_version: str = "0.5.0"
) -> dict[str, object]:
    """A spec naming `gpus` GPUs by index and `all`, as `nvidia-ctk cdi generate` does."""
    devices: list[dict[str, object]] = [
        {"name": str(index), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}
        for index in range(gpus)
    ]
    if gpus:
        devices.append(
            {
                "name": "all",
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{index}"} for index in range(gpus)]
                },
            }
        )
    return {
        "cdiVersion": cdi_version,
        "kind": kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }


def write_spec(root: HostRoot, gpus: int = 2, relative: str = SPEC, **fields: str) -> Path:
    """A valid `nvidia.com/gpu` spec at `relative` (the driver-manager's file by default)."""
    return write(root, relative, json.dumps(spec_document(gpus, **fields), indent=2))
