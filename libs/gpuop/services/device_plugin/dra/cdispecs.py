"""One CDI spec per prepared claim: what containerd gives a container for the claim's devices.

Named as NVIDIA's DRA driver names them, so tools and users find the same names: the file
`<host root>/var/run/cdi/k8s.gpu.nvidia.com-claim_<uid>.yaml`, kind
`k8s.gpu.nvidia.com/claim`, one device `<uid>-<device name>` per device of the claim (a
claim uid is unique, so no name is reused across claims, which runtimes may cache). The
content is what gpuop's `nvidia.com/gpu` spec gives the same GPU or MIG device, made by the
same code (`gpuop.host.cdi.spec`): each device its device nodes, the spec-wide edits the
control device nodes, `NVIDIA_VISIBLE_DEVICES=void` and the installed driver's files from its
manifest. Where no driver installed by gpuop is in use (its manifest cannot be read) the
spec has device nodes only, as the device plugin's own spec does, and says why in the log.
The document is JSON, which is YAML. Written atomically at prepare, removed at unprepare.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from gpuop.host import cdi as host_cdi
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants

log = logging.getLogger(__name__)

VENDOR = "k8s.gpu.nvidia.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"


def device_id(claim_uid: str, device: str) -> str:
    """The claim's device's name in the spec: `<claim uid>-<device name>`."""
    return f"{claim_uid}-{device}"


def qualified_name(claim_uid: str, device: str) -> str:
    """What NodePrepareResources answers: `k8s.gpu.nvidia.com/claim=<uid>-<device>`."""
    return f"{KIND}={device_id(claim_uid, device)}"


def spec_path(root: HostRoot, claim_uid: str) -> Path:
    return root.join(f"{constants.CDI_SPEC_DIR}/{VENDOR}-{CLASS}_{claim_uid}.yaml")


def write(root: HostRoot, claim_uid: str, devices: Sequence[tuple[str, tuple[str, ...]]]) -> Path:
    """Write the claim's spec for `devices` (device name, its host device nodes)."""
    try:
        driver = host_cdi.driver_files(root)
    except host_cdi.CdiError as error:
        log.warning("claim %s's CDI spec gets device nodes only: %s", claim_uid, error)
        driver = host_cdi.DriverFiles("", ())
    document = host_cdi.spec(
        [host_cdi.Device((device_id(claim_uid, name),), nodes) for name, nodes in devices],
        driver,
        host_cdi.control_nodes(root),
        kind=KIND,
        root=root,
    )
    path = spec_path(root, claim_uid)
    write_atomic(path, json.dumps(document, indent=2) + "\n")
    return path


def remove(root: HostRoot, claim_uid: str) -> None:
    """Remove the claim's spec; nothing when it is gone already."""
    spec_path(root, claim_uid).unlink(missing_ok=True)
