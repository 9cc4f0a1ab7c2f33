"""The boundary with nvidia-ml-py: every pynvml call goes through `Binding`.

`PynvmlBackend` (`real.py`) and its event watcher name pynvml functions by string and call
them here, which turns each `pynvml.NVMLError` into the typed tree of `errors.py` and keeps
pynvml's untyped values behind one seam. Unit tests hand `Binding` a fake module built from
the recorded H200 answers; on a node it is the real `pynvml`.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpuop.nvml.errors import (
    FunctionNotFound,
    InvalidArgument,
    LibraryNotFound,
    NotSupported,
    NvmlError,
    error_for_code,
)


def load_pynvml() -> Any:
    """Import nvidia-ml-py's `pynvml` module. Importing needs no GPU; `nvmlInit()` does."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise LibraryNotFound(f"nvidia-ml-py is not installed: {exc}") from exc


def text(value: Any) -> str:
    """A pynvml string answer as `str` (older bindings return `bytes`)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


class Binding:
    """Calls into one pynvml module, translating its errors."""

    def __init__(self, module: Any) -> None:
        self.lib = module

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """Call `pynvml.<function>`; NVML failures raise the matching `NvmlError`."""
        try:
            fn = getattr(self.lib, function)
        except AttributeError:
            raise FunctionNotFound(f"{function}: not in this nvidia-ml-py") from None
        try:
            return fn(*args, **kwargs)
        except self.lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if not isinstance(code, int):
                raise NvmlError(f"{function}: {exc}") from exc
            raise error_for_code(code, f"{function}: {_describe(exc, code)}") from exc

    def optional(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """Like `call`, but `None` when the GPU answers NotSupported: the value is absent."""
        try:
            return self.call(function, *args, **kwargs)
        except NotSupported:
            return None

    def probe(self, function: str, *args: Any) -> Any:
        """Like `optional`, and also `None` for an argument NVML refuses (a link number or
        profile index past what this GPU has), for queries that walk a range."""
        try:
            return self.call(function, *args)
        except (NotSupported, InvalidArgument):
            return None

    def constant(self, name: str) -> int:
        """An integer constant of the module, such as `NVML_CLOCK_SM`."""
        return int(getattr(self.lib, name))


def _describe(exc: BaseException, code: int) -> str:
    # pynvml's __str__ asks the library for unknown codes, which fails without a driver.
    try:
        return str(exc)
    except Exception:
        return f"NVML error {code}"
