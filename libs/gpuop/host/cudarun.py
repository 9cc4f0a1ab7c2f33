"""The CUDA probe's child process: `python -m gpuop.host.cudarun LIBCUDA` loads that
`libcuda` with ctypes, calls `cuInit(0)`, `cuDeviceGetCount`, and on every device
`cuDeviceGet`, `cuCtxCreate` and `cuCtxDestroy`, and prints one JSON line:

    {"call": "cuInit", "error": 100, "devices": 0}     the first call that failed
    {"call": null, "error": 0, "devices": 8}           every GPU took a context

Run by `gpuop.host.cuda.LibcudaProbe` in a process of its own, so a libcuda that hangs or
crashes takes only this process down (the parent kills it at its timeout). Imports nothing
of gpuop, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import ctypes
import json
import sys


def _probe(path: str) -> dict[str, object]:
    try:
        cuda = ctypes.CDLL(path)
    except OSError as error:
        return {"call": "dlopen", "error": -1, "devices": 0, "detail": str(error)[:500]}
    state: dict[str, object] = {"call": None, "error": 0, "devices": 0}

    def call(name: str, *arguments: object) -> bool:
        # cuCtxCreate and cuCtxDestroy are macros for their _v2 symbols since CUDA 4
        function = getattr(cuda, f"{name}_v2", None) or getattr(cuda, name)
        status = int(function(*arguments))
        if status != 0:
            state.update(call=name, error=status)
        return status == 0

    count = ctypes.c_int(0)
    if not call("cuInit", ctypes.c_uint(0)) or not call("cuDeviceGetCount", ctypes.byref(count)):
        return state
    state["devices"] = count.value
    for ordinal in range(count.value):
        device, context = ctypes.c_int(0), ctypes.c_void_p(None)
        if not call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal)):
            break
        if not call("cuCtxCreate", ctypes.byref(context), ctypes.c_uint(0), device):
            state["ordinal"] = ordinal
            break
        if not call("cuCtxDestroy", context):
            state["ordinal"] = ordinal
            break
    return state


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuop.host.cudarun LIBCUDA", file=sys.stderr)
        return 2
    print(json.dumps(_probe(argv[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
