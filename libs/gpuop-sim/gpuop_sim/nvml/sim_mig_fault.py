"""A MIG call made to fail from outside a node's services: the cross-process MIG fault knob.

`SimNvml.fail_mig_call` reaches only the session of the process that calls it; the
driver-manager that applies a layout is a process of its own (`gpuop demo`, the e2e stack),
so a test that wants an apply to fail midway asks through a file under the node's host root,
as the GPU reset fault does (`gpuop_sim.host.simreset`):

    run/gpuop/sim-nvml/mig-fault    {"call": "create_gpu_instance", "after": 9}

`call` is one of `CALLS`; the call succeeds `after` more times on that node (counted across
all its processes), then raises `NvmlError` (`NVML_ERROR_UNKNOWN`) once, and the file is gone:
the fault is one-shot, so the restore that follows succeeds. Every `SimNvml` made with the
file (`--nvml sim:` makes them so) reads it, under a lock beside it, before each MIG write
call; reads never consult it.

A file that is not such an object is refused, not ignored: every MIG write call then raises
`InvalidArgument` naming the file and what is wrong with it, and the file stays until it is
fixed or removed, so a mistyped fault fails the apply loudly instead of letting it succeed.
`set_fault` checks what it writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host.files import exclusive_lock, write_atomic
from gpuop.nvml.errors import InvalidArgument, NvmlError

MIG_FAULT = "run/gpuop/sim-nvml/mig-fault"
"""Where a node's MIG fault is kept under its host root."""
CALLS = (
    "set_mig_mode",
    "create_gpu_instance",
    "destroy_gpu_instance",
    "create_compute_instance",
    "destroy_compute_instance",
)
NVML_ERROR_UNKNOWN = 999
_SHAPE = 'expected {"call": <MIG call>, "after": <successes before it fails>}'


def set_fault(host_root: Path, call: str, *, after: int = 0) -> None:
    """Make `call` on the node at `host_root` succeed `after` more times, then fail once."""
    _checked({"call": call, "after": after})
    write_atomic(host_root / MIG_FAULT, json.dumps({"call": call, "after": after}))


def clear_fault(host_root: Path) -> None:
    """No MIG fault on the node at `host_root`."""
    (host_root / MIG_FAULT).unlink(missing_ok=True)


def take(path: Path, call: str) -> NvmlError | None:
    """The error `call` raises now, when the fault file at `path` says so; counts a success
    of the faulted call otherwise."""
    if not path.exists():
        return None
    with exclusive_lock(path.with_name(f".{path.name}.lock")):
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            faulted, after = _parsed(text)
        except ValueError as malformed:
            return InvalidArgument(f"simulated MIG fault {path}: {malformed}")
        if faulted != call:
            return None
        if after > 0:
            write_atomic(path, json.dumps({"call": call, "after": after - 1}))
            return None
        path.unlink()
    return NvmlError(f"{call}: injected fault ({MIG_FAULT})", code=NVML_ERROR_UNKNOWN)


def _parsed(text: str) -> tuple[str, int]:
    try:
        fault = json.loads(text)
    except ValueError as not_json:
        raise ValueError(f"not JSON ({not_json}): {_SHAPE}") from None
    return _checked(fault)


def _checked(fault: object) -> tuple[str, int]:
    """The call and count of a valid fault; `ValueError` saying what is wrong otherwise."""
    if not isinstance(fault, dict) or set(fault) != {"call", "after"}:
        raise ValueError(_SHAPE)
    call, after = fault["call"], fault["after"]
    if not isinstance(call, str) or call not in CALLS:
        raise ValueError(f"unknown MIG call {call!r}: expected one of {', '.join(CALLS)}")
    if type(after) is not int or after < 0:
        raise ValueError(f"after must be a whole number of successes, not {after!r}")
    return call, after
