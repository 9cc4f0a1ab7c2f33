"""Which kubelet API this node's GPUs are served through, kept on the host.

`SetDeviceApi` chooses (the device-API saga sends it); the choice is written to
`<host root>/var/lib/gpuop/device-plugin/device-api` before the plugin switches, so a
restarted plugin (a new pod, a node reboot) serves the same API without waiting for the
bus. No file means the device plugin API, gpuop's default; a file that names no API is
logged and read as the default, which is what the saga will see reported and correct.
"""

from __future__ import annotations

import logging

from gpuop.events.device_api_commands import DeviceApi
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

log = logging.getLogger(__name__)

FILE = "var/lib/gpuop/device-plugin/device-api"
"""Relative to the host root."""
DEFAULT = DeviceApi.DEVICE_PLUGIN


def load(root: HostRoot) -> DeviceApi:
    """The API chosen last on this host; the default when none was."""
    text = root.read_text(FILE)
    if text is None:
        return DEFAULT
    try:
        return DeviceApi(text.strip())
    except ValueError:
        log.error("%s names no device API (%r): serving %s", root.join(FILE), text, DEFAULT)
        return DEFAULT


def save(root: HostRoot, api: DeviceApi) -> None:
    write_atomic(root.join(FILE), f"{api}\n")
