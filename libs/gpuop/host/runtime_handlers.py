"""The node's container runtimes and whether their configuration has the `nvidia` handler.

Discovery's inventory names each runtime found on the host (containerd, CRI-O), its version
and whether its effective configuration defines the runtime handler `nvidia` that the
RuntimeClass `nvidia` names; called by `gpuop.inventory.scanning` on every scan. It reads
the configuration as the runtime would at its next start, with `tomllib`:

- containerd: `/etc/containerd/config.toml`, then every file its `imports` name (see
  `_imported_files` for where relative ones resolve; a missing file that is no glob stops
  containerd), in the order found, each file once. Up
  to containerd 1.7 a file that sets a plugin's table replaces the whole table (containerd
  #5837), from 2.0 (and for a `version = 3` main file) tables merge key by key. The handler
  is `plugins.<cri>.containerd.runtimes.nvidia` under the CRI plugin of any config version
  (`io.containerd.grpc.v1.cri` for 2, `io.containerd.cri.v1.runtime` for 3, `cri` for 1).
  Without a main file containerd runs its defaults, which import nothing.
- CRI-O: `/etc/crio/crio.conf`, then every regular file of `/etc/crio/crio.conf.d/` in name
  order, key by key; the handler is `crio.runtime.runtimes.nvidia`. Dot-files are skipped:
  they are an atomic writer's temporary files, and one read half-written would flap the node.

A file that does not parse makes the runtime refuse to start: the runtime is reported with
that error and without the handler, and the scan goes on. The version comes from the package
database (`/var/lib/dpkg/status`: `containerd`, `containerd.io`, `cri-o`) or, for a runtime
installed from a release tarball, from the Go build information of its binary (the
`-X .../version.Version=` link flag its release build sets, or the main module's version).
"""

from __future__ import annotations

import enum
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from gpuop.host import gobinaries
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

CONTAINERD_CONFIG = "etc/containerd/config.toml"
CRIO_CONFIG = "etc/crio/crio.conf"
CRIO_DROP_INS = "etc/crio/crio.conf.d"
CONFIG_DIRECTORIES = ("etc/containerd", "etc/containerd/conf.d", "etc/crio", CRIO_DROP_INS)
"""Where the configuration and the drop-ins gpuop writes live: discovery watches these."""
DPKG_STATUS = "var/lib/dpkg/status"
HANDLER = "nvidia"
"""The runtime handler's name, which the RuntimeClass `nvidia` names."""
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "cri")
"""The CRI plugin's table in containerd config versions 2, 3 and 1."""
MAX_IMPORTS = 64
"""Files one containerd configuration may pull in; more is a loop or a mistake."""
MAX_CONFIG_BYTES = 2**20


class Runtime(enum.StrEnum):
    """A container runtime gpuop can configure."""

    CONTAINERD = "containerd"
    CRIO = "crio"


_PACKAGES = {Runtime.CONTAINERD: ("containerd", "containerd.io"), Runtime.CRIO: ("cri-o",)}
_BINARIES = {
    Runtime.CONTAINERD: ("usr/bin/containerd", "usr/local/bin/containerd"),
    Runtime.CRIO: ("usr/bin/crio", "usr/local/bin/crio"),
}
_CONFIGS = {Runtime.CONTAINERD: (CONTAINERD_CONFIG,), Runtime.CRIO: (CRIO_CONFIG, CRIO_DROP_INS)}
_EPOCH = re.compile(r"^[0-9]+:")
_DPKG_PACKAGE = re.compile(
    r"^Package: (" + "|".join(re.escape(n) for names in _PACKAGES.values() for n in names) + r")$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class RuntimeState:
    """One container runtime found on the host."""

    runtime: Runtime
    version: str | None
    """Its version (`1.6.20~ds1-1+deb12u3`, `v2.0.0`); None when neither source says."""
    nvidia_handler: bool
    """Whether its configuration, as it would load it, defines the `nvidia` handler."""
    config_files: tuple[str, ...] = ()
    """The files that make its configuration, in the order it reads them."""
    error: str | None = None
    """Why it would refuse its configuration (a file that does not parse); None when fine."""
    cdi_enabled: bool | None = None
    """Whether it gives a container the devices a CDI name asks for: containerd 1.6 never,
    1.7 with `enable_cdi = true`, 2.x unless `enable_cdi = false`; CRI-O from 1.24 always.
    None when neither its version nor its configuration says."""


def runtimes(root: HostRoot) -> tuple[RuntimeState, ...]:
    """Every runtime installed on the host (a binary, a package, a configuration file or a
    drop-in of it), containerd first; nothing raises for a bad file."""
    packages = _dpkg_versions(root)
    found = []
    for runtime in Runtime:
        version = next((packages[name] for name in _PACKAGES[runtime] if name in packages), None)
        binaries = [path for path in _BINARIES[runtime] if root.resolve(path).is_file()]
        configured = any(_has_config(root, path) for path in _CONFIGS[runtime])
        if version is None and not binaries and not configured:
            continue
        if version is None and binaries:
            version = gobinaries.reported_version(root.resolve(binaries[0]))
        reader = _containerd if runtime is Runtime.CONTAINERD else _crio
        found.append(reader(root, version))
    return tuple(found)


def _has_config(root: HostRoot, relative: str) -> bool:
    """A configuration file, or a drop-in directory with a file in it: an empty directory
    is what a package or gpuop's own watch setup leaves, not a runtime."""
    path = root.resolve(relative)
    if not path.is_dir():
        return path.exists()
    try:
        return any(not name.startswith(".") for name in root.list_dir(relative))
    except HostReadError:
        return True


def _containerd(root: HostRoot, version: str | None) -> RuntimeState:
    files: list[str] = []
    try:
        main = _read_toml(root, CONTAINERD_CONFIG)
        if main is None:  # containerd's defaults
            cdi = _containerd_cdi(version, {}, {})
            return RuntimeState(Runtime.CONTAINERD, version, False, cdi_enabled=cdi)
        release = _release(version)
        merge_tables = main.get("version") == 3 or (release is not None and release >= (2, 0))
        config = _containerd_tree(root, main, files, merge_tables, release)
    except _ConfigError as error:
        return RuntimeState(Runtime.CONTAINERD, version, False, tuple(files), str(error))
    handler = any(
        _table(config, "plugins", plugin, "containerd", "runtimes", HANDLER) is not None
        for plugin in CRI_PLUGINS
    )
    cdi = _containerd_cdi(version, main, config)
    return RuntimeState(Runtime.CONTAINERD, version, handler, tuple(files), cdi_enabled=cdi)


def _containerd_cdi(
    version: str | None, main: Mapping[str, Any], config: Mapping[str, Any]
) -> bool | None:
    """Whether containerd resolves CDI names, from its release and `enable_cdi` (any config
    version's CRI table; 2.x migrates a version 2 file's switch to its own)."""
    switches = [
        switch
        for plugin in CRI_PLUGINS
        if isinstance(switch := (_table(config, "plugins", plugin) or {}).get("enable_cdi"), bool)
    ]
    release = _release(version)
    if release is None:  # the config's version says which containerd reads it, if anything
        if False in switches:
            return False
        return True if True in switches or main.get("version") == 3 else None
    if release < (1, 7):
        return False  # no CDI at all: `enable_cdi` is ignored
    if release < (2, 0):
        return bool(switches) and all(switches)
    return False not in switches


def _containerd_tree(
    root: HostRoot,
    main: dict[str, Any],
    files: list[str],
    merge_tables: bool,
    release: tuple[int, int] | None,
) -> dict[str, Any]:
    """The main file merged with every file it imports, as containerd loads them: the main
    file first, then each import queued in the order found, every file once."""
    merged: dict[str, Any] = {}
    pending: list[tuple[str, dict[str, Any] | None]] = [(CONTAINERD_CONFIG, main)]
    while pending:
        path, config = pending.pop(0)
        if "/" + path in files:
            continue
        config = config if config is not None else _read_toml(root, path)
        if config is None:
            continue
        files.append("/" + path)
        if len(files) > MAX_IMPORTS:
            raise _ConfigError(f"/{path}: more than {MAX_IMPORTS} files imported")
        imports = config.get("imports", [])
        if not isinstance(imports, list) or not all(isinstance(item, str) for item in imports):
            raise _ConfigError(f"/{path}: imports is not a list of paths")
        pending += [(imported, None) for imported in _imported_files(root, path, imports, release)]
        merged = _merge(merged, config, deep_plugins=merge_tables)
    return merged


def _imported_files(
    root: HostRoot, importer: str, patterns: list[str], release: tuple[int, int] | None
) -> Iterator[str]:
    """The files `patterns` name, as containerd resolves them: a path without `*` relative
    to the importing file's directory, and one that is missing stops containerd; a glob
    (`*` in its last part) matched in name order, relative to the importing file's
    directory, except before 1.7, where containerd globs a relative pattern from its
    working directory (`/` under systemd: seen with Debian's 1.6.20)."""
    base = PurePosixPath("/" + importer).parent
    for pattern in patterns:
        glob = "*" in pattern
        if not pattern.startswith("/") and glob and release is not None and release < (1, 7):
            full = PurePosixPath("/") / pattern
        else:
            full = PurePosixPath(pattern) if pattern.startswith("/") else base / pattern
        directory, name = str(full.parent).lstrip("/"), full.name
        if not glob:
            if not root.resolve(f"{directory}/{name}").is_file():
                raise _ConfigError(f"/{importer}: imports {full}, which does not exist")
            yield f"{directory}/{name}"
            continue
        try:
            candidates = sorted(root.resolve(directory).glob(name))
        except (OSError, ValueError):
            continue
        for candidate in candidates:
            if candidate.is_file():
                yield f"{directory}/{candidate.name}"


def _crio(root: HostRoot, version: str | None) -> RuntimeState:
    files: list[str] = []
    merged: dict[str, Any] = {}
    try:
        drop_ins = [
            f"{CRIO_DROP_INS}/{name}"
            for name in root.list_dir(CRIO_DROP_INS)
            if not name.startswith(".") and root.resolve(f"{CRIO_DROP_INS}/{name}").is_file()
        ]
        for path in (CRIO_CONFIG, *drop_ins):
            table = _read_toml(root, path)
            if table is not None:
                files.append("/" + path)
                merged = _merge(merged, table, deep_plugins=True)
    except HostReadError as error:
        return RuntimeState(Runtime.CRIO, version, False, tuple(files), str(error))
    except _ConfigError as error:
        return RuntimeState(Runtime.CRIO, version, False, tuple(files), str(error))
    handler = _table(merged, "crio", "runtime", "runtimes", HANDLER) is not None
    release = _release(version)
    cdi = release is None or release >= (1, 24)  # no switch: CDI is on since 1.24
    return RuntimeState(Runtime.CRIO, version, handler, tuple(files), cdi_enabled=cdi)


class _ConfigError(Exception):
    """A configuration file the runtime would refuse."""


def _read_toml(root: HostRoot, relative: str) -> dict[str, Any] | None:
    try:
        path = root.resolve(relative)
        if path.exists() and path.stat().st_size > MAX_CONFIG_BYTES:
            raise _ConfigError(f"/{relative}: larger than {MAX_CONFIG_BYTES} bytes")
        text = root.read_text(relative)
    except HostReadError as error:
        raise _ConfigError(f"/{relative}: {error.reason}") from None
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _ConfigError(f"/{relative}: {error}") from None


def _merge(base: dict[str, Any], top: Mapping[str, Any], *, deep_plugins: bool) -> dict[str, Any]:
    """`top` over `base`: tables merge key by key, except that without `deep_plugins` each
    plugin's table in `top` replaces the one in `base` whole (containerd 1.x)."""
    merged = dict(base)
    for key, value in top.items():
        old = merged.get(key)
        if key == "plugins" and not deep_plugins and isinstance(value, Mapping):
            merged[key] = {**(old if isinstance(old, Mapping) else {}), **value}
        elif isinstance(old, dict) and isinstance(value, Mapping):
            merged[key] = _merge(old, value, deep_plugins=deep_plugins)
        else:
            merged[key] = value
    return merged


def _table(tree: Mapping[str, Any], *keys: str) -> Mapping[str, Any] | None:
    node: Any = tree
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node if isinstance(node, Mapping) else None


def _release(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"^v?([0-9]+)\.([0-9]+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _dpkg_versions(root: HostRoot) -> dict[str, str]:
    """Installed packages' versions from dpkg's status file, the epoch left out; only the
    runtimes' packages. Empty on a host without dpkg."""
    try:
        text = root.read_text(DPKG_STATUS) or ""
    except HostReadError:
        return {}
    found: dict[str, str] = {}
    # the file lists every package of the host (megabytes): only the runtimes' stanzas are
    # split into fields
    for match in _DPKG_PACKAGE.finditer(text):
        end = text.find("\n\n", match.start())
        stanza = text[match.start() : end if end >= 0 else len(text)]
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[:1] != " "
        )
        status = fields.get("Status", "").split()
        if status[-1:] == ["installed"]:
            version = _EPOCH.sub("", fields.get("Version", "").strip())
            found[match.group(1)] = version or "unknown"
    return found
