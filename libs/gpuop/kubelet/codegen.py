"""Generates the kubelet API stubs in `gpuop.kubelet` from `proto/kubelet`.

Run by `make proto` (`python -m gpuop.kubelet.codegen`); the drift test calls `render()`
and compares it with the committed files. Every proto is named `api.proto`, so they are
compiled from the `proto/` tree (`-I proto`): their descriptors are registered under their
paths there (`kubelet/deviceplugin/v1beta1/api.proto`, `kubelet/dra/v1/api.proto`, ...) and
never collide, even where two share a proto package (`v1`: podresources and dra-health).
protoc writes imports relative to that tree (`from kubelet.deviceplugin...`); they are
rewritten to the package the stubs live in (`from gpuop.kubelet.deviceplugin...`), whose
directory is the proto's with `-` spelled `_`, as protoc writes it (`dra-health` is no
Python name).

Needs the dev tools: grpcio-tools (protoc, the Python and gRPC generators) and
mypy-protobuf (the `.pyi` stubs), pinned in pyproject.toml so output is reproducible.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

PROTOS = (
    "kubelet/deviceplugin/v1beta1/api.proto",
    "kubelet/podresources/v1/api.proto",
    "kubelet/pluginregistration/v1/api.proto",
    "kubelet/dra/v1/api.proto",
    "kubelet/dra/v1beta1/api.proto",
    "kubelet/dra-health/v1/api.proto",
)
"""The sources, relative to the proto root."""
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")
"""What each source generates, beside an `__init__.py` in its package."""
PACKAGE_INIT = '"""Generated from `proto/{source}` by `make proto`; do not edit."""\n'

_IMPORT = re.compile(r"^from kubelet\.", re.MULTILINE)


class CodegenError(RuntimeError):
    """protoc or one of its plugins failed; the message carries its exit status."""


def repository_root() -> Path:
    """The checkout this module sits in (`libs/gpuop/kubelet/codegen.py`)."""
    return Path(__file__).resolve().parents[3]


def render(proto_root: Path) -> dict[str, str]:
    """Every generated file's text, by path relative to `libs/gpuop`."""
    from grpc_tools import protoc  # a dev dependency: only `make proto` and its test need it

    with tempfile.TemporaryDirectory(prefix="gpuop-proto-") as scratch:
        out = Path(scratch)
        arguments = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out=quiet:{out}",
            f"--mypy_grpc_out=quiet:{out}",
            *PROTOS,
        ]
        status = protoc.main(arguments)
        if status != 0:
            raise CodegenError(f"protoc exited with status {status}")
        rendered: dict[str, str] = {}
        for source in PROTOS:
            package = Path(source).parent
            python_package = _python_name(package)
            # kubelet/__init__.py is hand-written; dra/ is named after its first version's proto
            rendered.setdefault(
                f"{python_package.parent}/__init__.py", PACKAGE_INIT.format(source=source)
            )
            rendered[f"{python_package}/__init__.py"] = PACKAGE_INIT.format(source=source)
            for name in OUTPUTS:
                text = (out / python_package / name).read_text(encoding="utf-8")
                rendered[f"{python_package}/{name}"] = _IMPORT.sub("from gpuop.kubelet.", text)
        return rendered


def _python_name(package: Path) -> Path:
    return Path(str(package).replace("-", "_"))


def write(proto_root: Path, target: Path) -> list[Path]:
    """Write the generated files under `target` (`libs/gpuop`); returns what changed."""
    changed = []
    for relative, text in sorted(render(proto_root).items()):
        path = target / relative
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(path)
    return changed


def _plugin(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise CodegenError(f"{name} not found: install the dev extras (mypy-protobuf)")
    return found


def main() -> None:
    root = repository_root()
    for path in write(root / "proto", root / "libs" / "gpuop"):
        print(f"wrote {path.relative_to(root)}")


if __name__ == "__main__":
    main()
