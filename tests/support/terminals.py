"""A `gpuop` command on a pseudo-terminal, as a person at a terminal runs it (the demo's live
view draws only on a terminal)."""

from __future__ import annotations

import asyncio
import os
import re
import threading

from tests.support.processes import GPUOP


class Terminal:
    """A process on a pseudo-terminal of 160x60, its output collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.output = bytearray()
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Terminal:
        master, slave = os.openpty()
        self.process = await asyncio.create_subprocess_exec(
            *GPUOP, *self.args, stdin=slave, stdout=slave, stderr=slave,
            env={**os.environ, "COLUMNS": "160", "LINES": "60"},
        )  # fmt: skip
        os.close(slave)
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()
        return self

    def _read(self, master: int) -> None:
        try:
            while chunk := os.read(master, 65536):
                self.output.extend(chunk)
        except OSError:  # EIO once the last process holding the terminal is gone
            pass
        finally:
            os.close(master)

    @property
    def text(self) -> str:
        return bytes(self.output).decode(errors="replace")

    async def wait_for(self, pattern: str, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not re.search(pattern, self.text, flags=re.M):
                await asyncio.sleep(0.2)

    async def exit_code(self, timeout: float) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await asyncio.to_thread(self._reader.join, 10)
        return code

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
