"""From the `--nvml` flag to an `Nvml`: the one place services choose their backend.

    real              nvidia-ml-py on this node (`PynvmlBackend`)
    recorded:<file>   the answers recorded in an `nvml.json` (`RecordedNvml`)
    <name>:<arg>      the backend a plugin registers as `name` in the entry point group
                      `gpuop.nvml`: `sim:<gpus>` is `gpus` simulated H200s (1 to 64) from
                      `gpuop_sim`, their driver the `nvidia` module of the simulated kernel
                      under `--host-root`

Called by `gpuop run <service>` and `gpuop discover` with the settings' `nvml`, `host_root`
and `node`. Nothing is opened here: the service calls `init()` when it starts using GPUs.
"""

from __future__ import annotations

from pathlib import Path

from gpuop import plugins
from gpuop.nvml.errors import InvalidBackendSpec
from gpuop.nvml.protocol import Nvml
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml

FORMS = "real, sim:<gpus> (1-64) or recorded:<file>"


def open_backend(spec: str, *, host_root: Path, node: str, holder_id: str | None = None) -> Nvml:
    """The backend `spec` names. `holder_id` names the simulated session's hold on the
    `nvidia` module (say, the service's name); by default a per-process id.

    Raises `InvalidBackendSpec` for a malformed spec, a recording that is missing or
    unreadable, a plugin's refusal of its argument (a GPU count out of range), or a plugin
    that is not installed.
    """
    kind, _, argument = spec.partition(":")
    if kind == "real" and not argument:
        return PynvmlBackend()
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
    if kind in ("real", "recorded") or not kind.isidentifier():
        raise InvalidBackendSpec(f"--nvml {spec!r}: expected {FORMS}")
    try:
        backend = plugins.load("gpuop.nvml", kind, wanted_for=f"--nvml {spec!r}")
    except plugins.PluginMissing as missing:
        raise InvalidBackendSpec(f"--nvml {spec!r}: expected {FORMS}; {missing}") from None
    opened: Nvml = backend(argument, spec=spec, host_root=host_root, node=node, holder_id=holder_id)
    return opened
