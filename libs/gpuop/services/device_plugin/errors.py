"""What can go wrong in the device plugin, as the kubelet and the operator see it:

DevicePluginError
├── AllocationError      Allocate or GetPreferredAllocation cannot be answered: an unknown
│                        device id, a shared request over one, too few devices; the
│                        kubelet gets INVALID_ARGUMENT and shows UnexpectedAdmissionError
├── RegistrationFailed   the kubelet is not there or refused us; retried, never fatal
└── MpsError             an MPS control daemon cannot be run or does not answer; retried
    └── MpsProgramMissing   the host has no nvidia-cuda-mps-control: says what to install
"""

from __future__ import annotations


class DevicePluginError(Exception):
    """Base of the device plugin's errors."""


class AllocationError(DevicePluginError, ValueError):
    """A request the plugin cannot answer; the message names the device ids at fault."""


class RegistrationFailed(DevicePluginError):
    """Register did not succeed; the message carries the kubelet's answer."""


class MpsError(DevicePluginError):
    """An MPS control daemon could not be started, told its limits, or stopped."""


class MpsProgramMissing(MpsError):
    """The host has no `nvidia-cuda-mps-control`; the message says what to install."""
