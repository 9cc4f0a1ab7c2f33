"""The container runtime's `nvidia` handler with CDI: the drop-in files that add it to a
node's containerd or CRI-O, planned from what the host root holds, written atomically and
undone from the content they replaced.

Called by `gpuop runtime configure` (an admin, by hand) and by the driver-manager's
runtime-configure step, inside the saga's maintenance window (`gpuop.host.restarting`
restarts the runtime and waits for it to answer).

containerd: a drop-in `etc/containerd/conf.d/99-nvidia.toml`, loaded through `imports` in
the main config (`etc/containerd/config.toml`), which gets the import line when no import
covers the drop-in yet; every other byte of the main config is kept. The drop-in's schema
follows the node's containerd: version 3 (`io.containerd.cri.v1.runtime`) for 2.x, version 2
(`io.containerd.grpc.v1.cri`) for 1.6 and 1.7, asked from the binary's `--version` under the
host root, else read from the main config's `version`. containerd 1.x replaces a whole
plugin table with an imported one, so a version 2 drop-in repeats the main config's CRI
table and adds to it; 2.x merges key by key, so a version 3 drop-in holds only what it adds.
containerd 1.6 has no CDI: it ignores `enable_cdi`, and the plan says so.

CRI-O: `etc/crio/crio.conf.d/99-nvidia.conf`, read after the main config in lexical order;
CDI is always on there, the drop-in names the spec directories.

The handler starts as a copy of the runtime's default one (runc or crun, so `SystemdCgroup`
and the like carry over): with CDI, plain runc already injects the devices a device plugin
names. `runtime_path` points it at another binary (NVIDIA's `nvidia-container-runtime`).
"""

from __future__ import annotations

import copy
import fnmatch
import re
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from gpuop.host import tomlfiles
from gpuop.host.errors import HostError
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

HANDLER = "nvidia"
"""The runtime handler's name; the chart's RuntimeClass `nvidia` names it."""
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
"""Where the runtimes look for CDI specs (both runtimes' defaults, written out)."""
CONTAINERD_CONFIG = "etc/containerd/config.toml"
CONTAINERD_DROP_IN = "etc/containerd/conf.d/99-nvidia.toml"
CONTAINERD_BINARIES = ("usr/bin/containerd", "usr/local/bin/containerd")
CRIO_CONFIG = "etc/crio/crio.conf"
CRIO_DROP_IN_DIR = "etc/crio/crio.conf.d"
CRIO_DROP_IN = f"{CRIO_DROP_IN_DIR}/99-nvidia.conf"
CRIO_BINARIES = ("usr/bin/crio", "usr/local/bin/crio")
_VERSION_TIMEOUT = 10.0
_CRI_TABLE = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
_RELEASE = re.compile(r"\bv?(\d+)\.(\d+)(?:\.\d+)?")
_IMPORTS_LINE = re.compile(r"^[ \t]*imports[ \t]*=[ \t]*\[", re.MULTILINE)
_VERSION_LINE = re.compile(r"^[ \t]*version[ \t]*=[ \t]*\d+[ \t]*(?:#.*)?\n", re.MULTILINE)


class Runtime(StrEnum):
    """The container runtimes gpuop configures."""

    CONTAINERD = "containerd"
    CRIO = "crio"


class RuntimeConfigError(HostError):
    """The runtime's configuration cannot be planned: none found, or one it cannot read."""


@dataclass(frozen=True)
class FileChange:
    """One file the plan writes, with what it holds now (None: absent) for the undo."""

    relative: str
    """Its path under the host root: `etc/containerd/conf.d/99-nvidia.toml`."""
    before: str | None
    after: str


@dataclass(frozen=True)
class RuntimePlan:
    """What configuring `runtime` changes on one host root; nothing when it is configured."""

    runtime: Runtime
    drop_in: str
    """The drop-in's path under the host root."""
    drop_in_text: str
    """What the drop-in holds once configured (also when it already does)."""
    changes: tuple[FileChange, ...]
    """The files that differ from what they should hold, drop-in first."""
    config_version: int | None = None
    """containerd's config schema of the drop-in: 2 or 3; None for CRI-O."""
    runtime_version: str | None = None
    """The runtime binary's release, when it answered: `1.6.20`."""
    notes: tuple[str, ...] = ()
    """What the admin should know: containerd 1.6 has no CDI."""

    @property
    def changed(self) -> bool:
        """Whether applying the plan writes anything (and the runtime needs a restart)."""
        return bool(self.changes)


def plan(root: HostRoot, runtime: Runtime, *, runtime_path: str | None = None) -> RuntimePlan:
    """The drop-in `runtime` needs on `root`, and the file changes to get there."""
    if runtime_path is not None and not runtime_path.startswith("/"):
        raise ValueError(f"runtime path {runtime_path!r} is not absolute")
    if runtime is Runtime.CONTAINERD:
        return _plan_containerd(root, runtime_path)
    return _plan_crio(root, runtime_path)


def apply(root: HostRoot, planned: RuntimePlan) -> None:
    """Write every change of `planned`, each file in one rename: drop-in first, so the
    import line never names a file that is not there yet."""
    for change in planned.changes:
        write_atomic(root.join(change.relative), change.after)


def undo(root: HostRoot, planned: RuntimePlan) -> None:
    """Put back what `planned` replaced: the earlier content, or no file where there was none.
    The main config first, so it never imports a drop-in already gone."""
    for change in reversed(planned.changes):
        if change.before is None:
            root.join(change.relative).unlink(missing_ok=True)
        else:
            write_atomic(root.join(change.relative), change.before)


def release(root: HostRoot, binaries: tuple[str, ...]) -> tuple[int, int, str] | None:
    """(major, minor, text) of the first of `binaries` under `root` answering `--version`;
    None when none is there or none answers."""
    for relative in binaries:
        path = root.resolve(relative)
        if not path.is_file():
            continue
        try:
            answer = subprocess.run(
                [str(path), "--version"],
                capture_output=True,
                text=True,
                timeout=_VERSION_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = _RELEASE.search(answer.stdout.replace("containerd/containerd", ""))
        if answer.returncode == 0 and found is not None:
            text = found.group(0).lstrip("v")
            return int(found.group(1)), int(found.group(2)), text
    return None


def _plan_containerd(root: HostRoot, runtime_path: str | None) -> RuntimePlan:
    main_path = root.join(CONTAINERD_CONFIG)
    main_text = root.read_text(CONTAINERD_CONFIG)
    if main_text is None:
        raise RuntimeConfigError(
            f"no containerd config found at {main_path}: write one first "
            "(`containerd config default > /etc/containerd/config.toml`)"
        )
    main = tomlfiles.parse(main_path, main_text)
    binary = release(root, CONTAINERD_BINARIES)
    version = _containerd_schema(main_path, main, binary)
    cri_name = _CRI_TABLE[version]
    # the main config's own CRI table, under the name of its own schema: 2.x migrates each
    # file on its own, so a version 2 main config and a version 3 drop-in load together
    main_cri: dict[str, Any] = main.get("plugins", {}).get(_source_table(main), {})
    # 1.x replaces the whole CRI table with an imported one: repeat the main config's
    cri: dict[str, Any] = copy.deepcopy(main_cri) if version == 2 else {}
    # 1.7 needs the switch; 2.x defaults it on and 2.4 no longer knows the key (it warns),
    # so a version 3 drop-in sets it only to overrule a main config that turned CDI off
    if version == 2 or main_cri.get("enable_cdi") is False:
        cri["enable_cdi"] = True
    cri["cdi_spec_dirs"] = list(CDI_SPEC_DIRS)
    runtimes = main_cri.get("containerd", {}).get("runtimes", {})
    default = main_cri.get("containerd", {}).get("default_runtime_name", "runc")
    handler = _copied_runtime(runtimes, (default, "runc", "crun")) or {
        "runtime_type": "io.containerd.runc.v2"
    }
    if runtime_path is not None:
        handler.setdefault("options", {})["BinaryName"] = runtime_path
    cri.setdefault("containerd", {}).setdefault("runtimes", {})[HANDLER] = handler
    drop_in_text = _header("containerd") + tomlfiles.dumps(
        {"version": version, "plugins": {cri_name: cri}}
    )
    changes = [_change(root, CONTAINERD_DROP_IN, drop_in_text)]
    if not _imported(main, CONTAINERD_DROP_IN, CONTAINERD_CONFIG):
        with_import = _add_import(main_path, main_text, _relative_import())
        changes.append(FileChange(CONTAINERD_CONFIG, main_text, with_import))
    notes: tuple[str, ...] = ()
    if binary is not None and binary[:2] < (1, 7):
        notes = (
            f"containerd {binary[2]} has no CDI (1.7 or later): the handler is added, "
            "the CDI keys are ignored until containerd is upgraded",
        )
    return RuntimePlan(
        runtime=Runtime.CONTAINERD,
        drop_in=CONTAINERD_DROP_IN,
        drop_in_text=drop_in_text,
        changes=tuple(c for c in changes if c.before != c.after),
        config_version=version,
        runtime_version=binary[2] if binary else None,
        notes=notes,
    )


def _containerd_schema(
    main_path: Path, main: dict[str, Any], binary: tuple[int, int, str] | None
) -> int:
    """The drop-in's config version: what the binary reads best, else the main config's."""
    declared = main.get("version")
    if binary is not None and binary[0] >= 2:
        return 3
    if binary is not None and declared != 2:
        raise RuntimeConfigError(
            f"{main_path}: config version {declared!r} with containerd {binary[2]}: gpuop's "
            "drop-in for containerd 1.x is version 2, which a version 1 config does not "
            "import alike; set `version = 2` in the main config"
        )
    if declared == 2:
        return 2
    if isinstance(declared, int) and declared >= 3:  # 2.4 writes version 4; it reads 3
        return 3
    raise RuntimeConfigError(
        f"{main_path}: config version {declared!r} and no containerd binary under the host "
        "root to ask: gpuop writes version 2 (containerd 1.6, 1.7) or 3 (2.x) drop-ins; "
        "set `version = 2` (or 3 on containerd 2.x) in the main config"
    )


def _source_table(main: dict[str, Any]) -> str:
    declared = main.get("version")
    if not isinstance(declared, int) or declared < 2:
        return "cri"  # version 1's name
    return _CRI_TABLE[min(declared, 3)]


def _copied_runtime(runtimes: dict[str, Any], candidates: tuple[str, ...]) -> dict[str, Any] | None:
    """A copy of the first of `candidates` that `runtimes` defines; None if none is."""
    for name in candidates:
        table = runtimes.get(name)
        if isinstance(table, dict):
            copied: dict[str, Any] = copy.deepcopy(table)
            return copied
    return None


def _imported(main: dict[str, Any], drop_in: str, main_relative: str) -> bool:
    """Whether one of the main config's `imports` globs names the drop-in; relative globs
    resolve against the main config's directory, as containerd resolves them."""
    target = "/" + drop_in
    base = PurePosixPath("/" + main_relative).parent
    for pattern in main.get("imports", []):
        if not isinstance(pattern, str):
            continue
        absolute = pattern if pattern.startswith("/") else str(base / pattern)
        if fnmatch.fnmatchcase(target, absolute):
            return True
    return False


def _add_import(main_path: Path, text: str, drop_in: str) -> str:
    """`text` with `drop_in` in its top-level `imports`, every other byte kept: into the
    existing array, else a new line after `version` (top-level keys precede every table)."""
    entry = tomlfiles.dumps({"x": drop_in}).split(" = ", 1)[1].strip()
    existing = _IMPORTS_LINE.search(text)
    if existing is not None:
        rest = text[existing.end() :]
        separator = "" if rest.lstrip().startswith("]") else ", "
        result = text[: existing.end()] + entry + separator + rest
    else:
        line = f"imports = [{entry}]\n"
        version = _VERSION_LINE.search(text)
        if version is not None and not _table_before(text, version.start()):
            result = text[: version.end()] + line + text[version.end() :]
        else:
            result = line + text
    if drop_in not in tomlfiles.parse(main_path, result).get("imports", []):
        raise RuntimeConfigError(
            f"{main_path}: could not add {drop_in} to its imports; add it by hand"
        )
    return result


def _table_before(text: str, offset: int) -> bool:
    return re.search(r"^[ \t]*\[", text[:offset], re.MULTILINE) is not None


def _plan_crio(root: HostRoot, runtime_path: str | None) -> RuntimePlan:
    main_path = root.join(CRIO_CONFIG)
    main_text = root.read_text(CRIO_CONFIG)
    has_dir = root.resolve(CRIO_DROP_IN_DIR).is_dir()
    binary = release(root, CRIO_BINARIES)
    if main_text is None and not has_dir and binary is None:
        raise RuntimeConfigError(
            f"no CRI-O found under {root.path}: neither {main_path} nor "
            f"{root.join(CRIO_DROP_IN_DIR)} nor a crio binary"
        )
    settings: dict[str, Any] = {}
    if main_text is not None:
        settings = tomlfiles.parse(main_path, main_text).get("crio", {}).get("runtime", {})
    for name in root.list_dir(CRIO_DROP_IN_DIR):
        relative = f"{CRIO_DROP_IN_DIR}/{name}"
        if relative == CRIO_DROP_IN or not root.resolve(relative).is_file():
            continue
        text = root.read_text(relative) or ""
        later = tomlfiles.parse(root.join(relative), text).get("crio", {}).get("runtime", {})
        settings = {**settings, **later}
    runtimes = settings.get("runtimes", {})
    default = settings.get("default_runtime", "crun")
    handler = _copied_runtime(runtimes, (default, "crun", "runc")) or _crio_fallback(root)
    if runtime_path is not None:
        handler["runtime_path"] = runtime_path
    document = {
        "crio": {"runtime": {"cdi_spec_dirs": list(CDI_SPEC_DIRS), "runtimes": {HANDLER: handler}}}
    }
    drop_in_text = _header("CRI-O") + tomlfiles.dumps(document)
    change = _change(root, CRIO_DROP_IN, drop_in_text)
    return RuntimePlan(
        runtime=Runtime.CRIO,
        drop_in=CRIO_DROP_IN,
        drop_in_text=drop_in_text,
        changes=(change,) if change.before != change.after else (),
        runtime_version=binary[2] if binary else None,
    )


def _crio_fallback(root: HostRoot) -> dict[str, Any]:
    """A handler on the OCI runtime the host has, when no config names one to copy."""
    for relative in ("usr/bin/crun", "usr/bin/runc", "usr/sbin/runc", "usr/local/bin/runc"):
        if root.resolve(relative).is_file():
            return {"runtime_path": "/" + relative, "runtime_type": "oci"}
    return {"inherit_default_runtime": True}


def _change(root: HostRoot, relative: str, after: str) -> FileChange:
    return FileChange(relative, root.read_text(relative), after)


def _header(runtime: str) -> str:
    return (
        f"# Written by gpuop: the `{HANDLER}` runtime handler for {runtime}, with CDI.\n"
        "# gpuop rewrites this file; change the node's main config instead.\n"
    )


def _relative_import() -> str:
    """The drop-in as the main config imports it: relative to the main config's directory,
    as containerd resolves it, so the same line holds on the node and under a host root."""
    return str(
        PurePosixPath(CONTAINERD_DROP_IN).relative_to(PurePosixPath(CONTAINERD_CONFIG).parent)
    )
