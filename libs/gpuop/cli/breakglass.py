"""The steps of `gpuop driver` (`gpuop.cli.driver` reads the flags): the driver-manager's
collaborators built on a host root as its service builds them (`Host`), each command run and
recorded through the agent's own path (`driver_manager.run_recorded`) under the host's state
lock, and the host's driver status per kernel (`status_of`). Everything of the driver-manager
comes through its public face, `gpuop.services.driver_manager.facade`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuop.cli.errors import CommandFailed
from gpuop.events import Event
from gpuop.events import driver as dm
from gpuop.host import components, modules, packages, system
from gpuop.host.roots import HostRoot
from gpuop.runtime.settings import Settings
from gpuop.services.driver_manager import facade as driver_manager

SOURCE = "/gpuop/driver-manager/{node}/cli"
"""The `source` of the answers the CLI records: told apart from the agent's."""


class Host:
    """The driver-manager's collaborators on one host root, as its service builds them."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        if not args.host_root.is_dir():
            raise ValueError(f"--host-root {args.host_root}: no such directory")
        if args.timeout is not None and not 1 <= args.timeout <= 7 * 86400:
            raise ValueError(f"--timeout {args.timeout}: 1 to 604800 seconds")
        node = args.node or environ.get("GPUOP_NODE") or socket.gethostname().lower()
        self.settings = Settings(
            service=dm.SERVICE,
            node=node,
            host_root=args.host_root,
            nvml=args.nvml,
            config=args.config,
        )
        named = _source(args) if getattr(args, "source", None) is not None else None
        self.executor = driver_manager.open_executor(self.settings, named)
        self.root: HostRoot = self.executor.root
        self.component = dm.Component(args.component)
        self.timeout: int | None = args.timeout
        """Every command's `timeout_seconds` when `--timeout` says, else their defaults."""
        self.store = driver_manager.StateStore(self.root)
        try:
            self.store.load()
        except driver_manager.StateCorrupt as exc:
            raise CommandFailed(f"the driver state is unreadable, refusing to act: {exc}") from None
        self.source = SOURCE.format(node=node)
        self.steps: list[Event] = []
        if args.kernel is not None and args.action != "status":
            running = system.kernel_release(self.root)
            if args.kernel != running:
                raise ValueError(
                    f"--kernel {args.kernel}: the host runs {running}, and the driver-manager "
                    "installs and loads for the running kernel"
                )

    async def run(self, command: driver_manager.ComponentCommand) -> Event:
        """`command` through the agent's path: recorded started, executed, recorded done."""
        if self.timeout is not None:
            command = command.model_copy(update={"timeout_seconds": self.timeout})
        assert self.settings.node is not None
        result = await driver_manager.run_recorded(
            self.executor,
            self.store,
            f"cli-{uuid.uuid4().hex}",
            command,
            node=self.settings.node,
            source=self.source,
        )
        self.steps.append(result)
        return result


@contextlib.contextmanager
def _locked(host: Host) -> Iterator[None]:
    """The driver-manager's state lock held for the block, after what an interrupted install
    left is removed; `CommandFailed` while a driver-manager holds it."""
    lock = driver_manager.StateLock(host.root)
    if not lock.try_acquire():
        raise CommandFailed(
            f"a driver-manager holds {lock.path}: stop the one on this node first (or let the "
            "orchestrator do it: gpuop upgrade)"
        )
    for path in driver_manager.clean_staging(host.root):
        print(f"removed what an interrupted install left: {path}")
    try:
        yield
    finally:
        lock.release()


async def install(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host = Host(args, environ)
    source = _source(args)
    with _locked(host):
        component, version = host.component, args.version
        await _step(
            host,
            dm.InstallDriver(component=component, version=version, source=source),
            args.output,
        )
        before = host.executor.reloader.loaded_version(component)
        if not args.no_load and before != version:
            await _step(
                host,
                dm.UnloadDriver(
                    component=component,
                    allow_management_interface=args.allow_management_interface,
                ),
                args.output,
            )
            try:
                await _step(host, dm.LoadDriver(component=component, version=version), args.output)
            except CommandFailed as failed:
                if before is None:
                    raise
                # the saga would roll back now; here a person decides
                raise CommandFailed(
                    f"{failed}; no {component} driver runs now: gpuop driver rollback "
                    f"--host-root {args.host_root} --version {before} loads {before} again"
                ) from None
        if args.validate:
            await _validate(host, version, args.output)
    _finish(host, args)
    return 0


async def rollback(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host = Host(args, environ)
    record = host.store.load().component(host.component)
    version = args.version or record.previous
    if version is None:
        installed = _installed(host.root, host.component)
        raise ValueError(
            f"no version to roll {host.component} back to: the host's state records none "
            f"before the last load; name one with --version (installed: "
            f"{', '.join(installed) or 'none'})"
        )
    source = _source(args) if args.source is not None else None
    with _locked(host):
        await _step(
            host,
            dm.RollbackDriver(component=host.component, version=version, source=source),
            args.output,
        )
        if args.validate:
            await _validate(host, version, args.output)
    _finish(host, args)
    return 0


async def status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host = Host(args, environ)
    found = status_of(host.root, host.store, host.component, args.kernel)
    if args.output == "json":
        print(json.dumps(found, indent=2))
    else:
        print(_status_text(found))
    return 0


async def _validate(host: Host, version: str, output: str) -> None:
    await _step(
        host,
        dm.ValidateDriver(component=host.component, version=version),
        output,
    )


async def _step(host: Host, command: driver_manager.ComponentCommand, output: str) -> None:
    """Run `command`; a failure stops the command with its answer's words (exit 1)."""
    result = await host.run(command)
    if output == "text":
        print(_answer_text(result))
    if isinstance(result, dm.DriverFailure):
        if output == "json":
            print(json.dumps({"steps": _steps(host)}, indent=2))
        raise CommandFailed(f"{command.VERB} failed: {result.message}")


def _finish(host: Host, args: argparse.Namespace) -> None:
    found = status_of(host.root, host.store, host.component, args.kernel)
    if args.output == "json":
        print(json.dumps({"steps": _steps(host), "status": found}, indent=2))
    else:
        print(_status_text(found))


def _steps(host: Host) -> list[dict[str, Any]]:
    return [{"event": step.NAME, **step.model_dump(mode="json")} for step in host.steps]


def _source(args: argparse.Namespace) -> dm.DriverSource:
    """The `--source` flags as a command carries them; `ValueError` for a source the
    driver-manager cannot read, a key that is neither a key nor a file."""
    uri: str = args.source
    scheme = urlsplit(uri).scheme.lower()
    if scheme not in ("http", "https", "file") and not uri.startswith("/"):
        raise ValueError(
            f"--source {uri!r}: expected an absolute directory, a file:// URL or an http(s) URL"
        )
    keys = tuple(_public_key(key) for key in args.public_key)
    if not keys and not args.allow_unsigned:
        raise ValueError(
            "name the key the source's index is signed with (--public-key), or "
            "--allow-unsigned to trust an unsigned one"
        )
    try:
        return dm.DriverSource(
            uri=uri,
            public_keys=keys,
            allow_unsigned=args.allow_unsigned,
            sha256=args.sha256,
            ca_bundle=args.ca_bundle,
        )
    except ValueError as exc:  # pydantic's ValidationError
        raise ValueError(f"--source flags: {exc}") from None


def _public_key(key: str) -> str:
    """A minisign public key given as itself or as a `.pub` file (its key line)."""
    path = Path(key)
    if "/" in key or key.endswith(".pub"):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"--public-key {key}: {exc.strerror}") from None
        keys = [line.strip() for line in lines if line.strip() and not line.startswith("untrusted")]
        if not keys:
            raise ValueError(f"--public-key {key}: the file holds no key")
        return keys[-1]
    return key


def status_of(
    root: HostRoot,
    store: driver_manager.StateStore,
    component: dm.Component,
    kernel: str | None = None,
) -> dict[str, Any]:
    """What the host has of `component`: per kernel (only `kernel` when given) the versions
    installed and the active one; the version loaded and its modules; the user-space switch;
    what the driver state remembers."""
    running = system.kernel_release(root)
    kernels: dict[str, Any] = {}
    modules_dir = root.join("lib/modules")
    releases = sorted(p.name for p in modules_dir.iterdir()) if modules_dir.is_dir() else []
    for release in releases:
        if kernel is not None and release != kernel:
            continue
        kernels[release] = {
            "running": release == running,
            "installed": list(packages.installed_versions(root, release, component)),
            "active": packages.active_version(root, release, component),
        }
    if kernel is not None and kernel not in kernels:
        raise ValueError(
            f"--kernel {kernel}: the host has no lib/modules/{kernel} "
            f"(it has: {', '.join(releases) or 'none'})"
        )
    names = components.modules_of(component)
    loaded = {module.name for module in modules.loaded_modules(root)}
    record = store.load().component(component)
    return {
        "host_root": str(root.path),
        "component": component.value,
        "running_kernel": running,
        "loaded": modules.module_version(root, names[0]),
        "modules_loaded": [name for name in names if name in loaded],
        "userspace": driver_manager.active_userspace(root, component),
        "previous": record.previous,
        "kernels": kernels,
    }


def _installed(root: HostRoot, component: dm.Component) -> tuple[str, ...]:
    running = system.kernel_release(root)
    return () if running is None else packages.installed_versions(root, running, component)


def _answer_text(result: Event) -> str:
    fields = result.model_dump(mode="json", exclude={"command_id", "component"})
    said = ", ".join(
        f"{k} {_plain(v)}"
        for k, v in fields.items()
        if v not in (None, "", [], {}) and v is not False
    )
    return f"{result.NAME}: {said}" if said else result.NAME


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_plain(v) for v in value) or "none"
    return str(value)


def _status_text(found: dict[str, Any]) -> str:
    lines = [
        f"{found['component']} on {found['host_root']} (kernel {found['running_kernel']})",
        f"  loaded     {found['loaded'] or 'nothing'}"
        + (f" ({', '.join(found['modules_loaded'])})" if found["modules_loaded"] else ""),
        f"  user space {found['userspace'] or 'none switched on'}",
        f"  previous   {found['previous'] or 'none recorded'}",
    ]
    for release, kernel in found["kernels"].items():
        mark = " (running)" if kernel["running"] else ""
        installed = ", ".join(kernel["installed"]) or "nothing"
        lines.append(f"  {release}{mark}: installed {installed}; active {kernel['active']}")
    return "\n".join(lines)
