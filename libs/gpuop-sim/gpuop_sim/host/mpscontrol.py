"""A stand-in `nvidia-cuda-mps-control` for simulated nodes: a real daemon process with the
real program's command line, directories and control commands, and no GPU behind it.

`install(root)` writes it to `<root>/usr/bin/nvidia-cuda-mps-control`, where the GPU
driver's user-space tools put the real one (`seeding` installs it with the GPU driver); the
device plugin runs it there (`gpuop.services.device_plugin.mpscontrol`, `chroot=False`). The
script loads this file by its path and runs `main`: only the standard library, so each run
of the front-end starts quickly.

    nvidia-cuda-mps-control -d   daemonize: the daemon listens on `control` in
                                 $CUDA_MPS_PIPE_DIRECTORY, writes its pid to
                                 `nvidia-cuda-mps-control.pid` there and logs every command
                                 to `control.log` in $CUDA_MPS_LOG_DIRECTORY; the program
                                 exits 0 once it answers (1, saying so, when one runs there
                                 already)
    nvidia-cuda-mps-control -f   the same daemon in the foreground
    nvidia-cuda-mps-control      the front-end: each line of stdin sent to the daemon, each
                                 answer printed; exit 1 when no daemon answers

Commands: `set_default_active_thread_percentage <p>`, `get_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit <dev> <n>M|G`, `get_default_device_pinned_mem_limit
<dev>`, `get_server_list`, `quit`. The limits live in the daemon's memory, as the real
daemon's do, so a daemon started again has lost them. The control pipe is a unix socket
(the real one uses named pipes), bound and reached from inside the pipe directory, so a long
directory path is no matter. The daemon also exits when its pipe directory or socket goes
away, so one left behind by a test that failed does not outlive its directory.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

PROGRAM = "nvidia-cuda-mps-control"
INSTALLED_AT = "usr/bin/nvidia-cuda-mps-control"
"""Where under a host root the driver's user-space tools put it."""
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
SOCKET = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
LOG_FILE = "control.log"
NO_DAEMON = "Cannot find MPS control daemon process"
ALREADY_RUNNING = "An instance of this daemon is already running"
HOUSEKEEPING_SECONDS = 0.5
"""How often the daemon looks whether its directory and socket are still there."""

_SCRIPT = """#!{python} -I
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpuop_sim_mps_control", {source!r})
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.main(sys.argv[1:]))
"""
_LIMIT = re.compile(r"^\d+(\.\d+)?[MG]$")


def install(root: Path) -> Path:
    """Write the stand-in into the host root `root`; its path."""
    path = root / INSTALLED_AT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_SCRIPT.format(python=sys.executable, source=str(Path(__file__).resolve())))
    path.chmod(0o755)
    return path


def main(arguments: list[str]) -> int:
    """The program: `-d`, `-f` or the front-end; its exit status."""
    pipe = Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE_DIR)
    logs = Path(os.environ.get(LOG_ENV) or DEFAULT_LOG_DIR)
    if arguments == ["-d"]:
        return _daemonize(pipe, logs)
    if arguments == ["-f"]:
        return _serve(pipe, logs, ready=None)
    if arguments:
        print(f"usage: {PROGRAM} [-d | -f]", file=sys.stderr)
        return 1
    return _front_end(pipe)


def ask(pipe: Path, command: str, timeout: float = 10.0) -> tuple[int, str]:
    """Send one command to the daemon of `pipe`: its status and answer. Raises `OSError`
    when no daemon listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        directory = os.open(pipe, os.O_PATH | os.O_DIRECTORY)
        try:
            connection.connect(f"/proc/self/fd/{directory}/{SOCKET}")
        finally:
            os.close(directory)
        connection.sendall(command.encode() + b"\n")
        connection.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    status, _, answer = b"".join(chunks).decode(errors="replace").partition(" ")
    return (int(status) if status.isdigit() else 1), answer.rstrip("\n")


def _front_end(pipe: Path) -> int:
    for line in sys.stdin.read().splitlines():
        command = line.strip()
        if not command:
            continue
        try:
            status, answer = ask(pipe, command)
        except OSError:
            print(NO_DAEMON)
            return 1
        if answer:
            print(answer)
        if status != 0:
            return status
    return 0


def _answers(pipe: Path) -> bool:
    try:
        ask(pipe, "get_server_list", timeout=2.0)
    except OSError:
        return False
    return True


def _daemonize(pipe: Path, logs: Path) -> int:
    if _answers(pipe):
        print(ALREADY_RUNNING, file=sys.stderr)
        return 1
    readable, writable = os.pipe()
    child = os.fork()
    if child > 0:
        os.close(writable)
        with os.fdopen(readable, "rb") as reader:
            said = reader.read().decode(errors="replace")
        os.waitpid(child, 0)
        if said == "ok":
            return 0
        print(said or "the daemon died while starting", file=sys.stderr)
        return 1
    os.close(readable)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    try:
        status = _serve(pipe, logs, ready=writable)
    except BaseException as error:  # the parent must hear why
        with contextlib.suppress(OSError):
            os.write(writable, f"cannot start: {error}".encode())
        status = 1
    os._exit(status)


@dataclass
class _Daemon:
    """What the daemon knows: its limits."""

    thread_percentage: float = 100.0
    pinned_memory: dict[str, str] = field(default_factory=dict)

    def execute(self, command: str) -> tuple[int, str]:
        words = command.split()
        verb, arguments = (words[0], words[1:]) if words else ("", [])
        if verb == "get_default_active_thread_percentage" and not arguments:
            return 0, f"{self.thread_percentage:.1f}"
        if verb == "set_default_active_thread_percentage" and len(arguments) == 1:
            try:
                value = float(arguments[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return 1, f"Invalid active thread percentage: {arguments[0]}"
            self.thread_percentage = value
            return 0, f"{value:.1f}"
        if verb == "set_default_device_pinned_mem_limit" and len(arguments) == 2:
            if not _LIMIT.match(arguments[1]):
                return 1, f"Invalid memory limit: {arguments[1]}"
            self.pinned_memory[arguments[0]] = arguments[1]
            return 0, ""
        if verb == "get_default_device_pinned_mem_limit" and len(arguments) == 1:
            return 0, self.pinned_memory.get(arguments[0], "none")
        if verb == "get_server_list" and not arguments:
            return 0, ""  # no client has connected: no server runs
        if verb == "quit" and not arguments:
            return 0, ""
        return 1, f"Unrecognized command: {command}"


def _serve(pipe: Path, logs: Path, ready: int | None) -> int:
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    log = open(logs / LOG_FILE, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    os.chdir(pipe)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)  # a daemon killed before left it; none answers there
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET)
    server.listen(16)
    server.settimeout(HOUSEKEEPING_SECONDS)
    ours = os.stat(SOCKET).st_ino
    Path(PID_FILE).write_text(f"{os.getpid()}\n")
    _log(log, f"Starting control daemon using socket {pipe / SOCKET}")
    if ready is not None:
        os.write(ready, b"ok")
        os.close(ready)
    daemon = _Daemon()
    try:
        while True:
            try:
                connection, _ = server.accept()
            except TimeoutError:
                if not _still_ours(ours):
                    _log(log, "The pipe directory went away: exiting")
                    return 0
                continue
            with connection:
                connection.settimeout(10.0)
                command = _read_command(connection)
                _log(log, f"Command: {command}")
                status, answer = daemon.execute(command)
                if command.strip() == "quit":
                    _stop(server, ours)
                    _log(log, "Control daemon exiting")
                    connection.sendall(f"{status} {answer}".encode())
                    return 0
                connection.sendall(f"{status} {answer}".encode())
    finally:
        _stop(server, ours)
        log.close()


def _read_command(connection: socket.socket) -> str:
    chunks = []
    with contextlib.suppress(TimeoutError):
        while chunk := connection.recv(65536):
            chunks.append(chunk)
            if b"\n" in chunk:
                break
    return b"".join(chunks).decode(errors="replace").strip()


def _still_ours(inode: int) -> bool:
    try:
        return os.stat(SOCKET).st_ino == inode
    except OSError:
        return False


def _stop(server: socket.socket, inode: int) -> None:
    """Close the socket and remove it and the pid file, unless another daemon's already."""
    server.close()
    if _still_ours(inode):
        with contextlib.suppress(OSError):
            os.unlink(SOCKET)
        with contextlib.suppress(OSError):
            os.unlink(PID_FILE)


def _log(log: TextIO, message: str) -> None:
    now = datetime.datetime.now().isoformat(sep=" ", timespec="milliseconds")
    print(f"[{now} Control {os.getpid()}] {message}", file=log)
