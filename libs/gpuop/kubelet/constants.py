"""The kubelet's device plugin constants (upstream `constants.go`), and where its sockets
lie under a host root. Used by the device plugin service, the simulated kubelet and
telemetry's PodResources client alike, so they agree on every path and string.
"""

from __future__ import annotations

VERSION = "v1beta1"
"""The device plugin API version sent at registration; the only one the kubelet supports."""

HEALTHY = "Healthy"
"""`Device.health` of a device the kubelet may allocate."""
UNHEALTHY = "Unhealthy"
"""`Device.health` of a device the kubelet must not allocate; capacity keeps counting it."""

DEVICE_PLUGIN_DIR = "var/lib/kubelet/device-plugins"
"""Where the kubelet and the device plugins put their sockets, relative to the host root."""
KUBELET_SOCKET = "kubelet.sock"
"""The kubelet's Registration socket in `DEVICE_PLUGIN_DIR`; re-created on kubelet restart."""
CHECKPOINT = "kubelet_internal_checkpoint"
"""The kubelet's allocation checkpoint in `DEVICE_PLUGIN_DIR`; nobody else deletes it."""

POD_RESOURCES = "pod-resources"
"""The kubelet's PodResources directory in its `--root-dir`."""
POD_RESOURCES_DIR = f"var/lib/kubelet/{POD_RESOURCES}"
"""Where the kubelet serves PodResources, relative to the host root; mount the directory,
not the socket, since a kubelet restart re-creates the socket with a new inode."""
POD_RESOURCES_SOCKET = "kubelet.sock"
"""The PodResources socket in `POD_RESOURCES_DIR`."""

CDI_SPEC_DIR = "var/run/cdi"
"""Where node agents write generated CDI specs, relative to the host root (tmpfs on most
hosts; higher priority than `/etc/cdi`)."""
