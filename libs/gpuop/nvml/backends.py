"""From the `--nvml` flag to an `Nvml`: the one place services choose their backend.

    real              nvidia-ml-py on this node (`PynvmlBackend`)
    sim:<gpus>        `gpus` simulated H200s (1 to 64), their driver the `nvidia` module of
                      the simulated kernel under `--host-root` (`SimNvml` + `HostRootModules`)
    recorded:<file>   the answers recorded in an `nvml.json` (`RecordedNvml`)

Called by `gpuop run <service>` and `gpuop discover` with the settings' `nvml`, `host_root`
and `node`. Nothing is opened here: the service calls `init()` when it starts using GPUs.
"""

from __future__ import annotations

from pathlib import Path

from gpuop.nvml.errors import InvalidBackendSpec
from gpuop.nvml.modules import HostRootModules
from gpuop.nvml.protocol import Nvml
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop.nvml.simulated import MAX_GPUS, SimNvml

FORMS = "real, sim:<gpus> (1-64) or recorded:<file>"


def open_backend(spec: str, *, host_root: Path, node: str, holder_id: str | None = None) -> Nvml:
    """The backend `spec` names. `holder_id` names the simulated session's hold on the
    `nvidia` module (say, the service's name); by default a per-process id.

    Raises `InvalidBackendSpec` for a malformed spec, a GPU count out of range, or a
    recording that is missing or unreadable.
    """
    kind, _, argument = spec.partition(":")
    if kind == "real" and not argument:
        return PynvmlBackend()
    if kind == "sim":
        if not argument.isdigit() or not 1 <= int(argument) <= MAX_GPUS:
            raise InvalidBackendSpec(
                f"--nvml {spec!r}: the GPU count must be a number from 1 to {MAX_GPUS}"
            )
        modules = HostRootModules(host_root)
        return SimNvml(int(argument), node=node, module_state=modules, holder_id=holder_id)
    if kind == "recorded":
        if not argument:
            raise InvalidBackendSpec(f"--nvml {spec!r}: name the recorded nvml.json file")
        path = Path(argument)
        if not path.is_file():
            raise InvalidBackendSpec(f"--nvml {spec!r}: no recording at {path}")
        try:
            return RecordedNvml(path)
        except (OSError, ValueError) as exc:
            raise InvalidBackendSpec(f"--nvml {spec!r}: {exc}") from exc
    raise InvalidBackendSpec(f"--nvml {spec!r}: expected {FORMS}")
