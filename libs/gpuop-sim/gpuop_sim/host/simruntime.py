"""The simulated node's container runtime (`gpuop.host.restarting.RuntimeService`), for the
driver-manager's runtime-configure step: a restart reads the runtime's configuration as the
runtime would at its start, and it answers only when that configuration loads.

    containerd  the main config and every file its `imports` name (relative to its
                directory, globs expanded): each must parse, and a named file must exist,
                as containerd refuses a missing import
    crio        the main config and every file of crio.conf.d: each must parse

A test or an operator of the demo keeps it from coming back by writing `FAULT` under the
host root (any content): the next restart leaves it down, as a runtime that fails to start.
Up at first, as the node's runtime is when the agent starts.
"""

from __future__ import annotations

import glob
import logging
import tomllib
from pathlib import PurePosixPath

from gpuop.host import runtimes
from gpuop.host.roots import HostRoot
from gpuop.host.runtimes import Runtime

log = logging.getLogger(__name__)

FAULT = "run/gpuop/sim-runtime/fault"
"""Present: the runtime does not come back from its next restart."""


class SimRuntime:
    """The simulated host's containerd or CRI-O."""

    def __init__(self, root: HostRoot) -> None:
        self.root = root
        self.up = True
        self.restarts = 0

    async def restart(self, runtime: Runtime) -> None:
        self.restarts += 1
        problem = "a fault was injected" if self.root.exists(FAULT) else self._refusal(runtime)
        self.up = problem is None
        if problem is not None:
            log.warning("simulated %s did not start: %s", runtime, problem)

    async def answering(self, runtime: Runtime) -> bool:
        return self.up

    def _refusal(self, runtime: Runtime) -> str | None:
        """Why `runtime` would refuse its configuration; None when it loads."""
        if runtime is Runtime.CONTAINERD:
            main = runtimes.CONTAINERD_CONFIG
            files = [main]
            text = self.root.read_text(main)
            if text is None:
                return f"{main} is missing"
            try:
                imports = tomllib.loads(text).get("imports", [])
            except tomllib.TOMLDecodeError as error:
                return f"{main}: {error}"
            base = PurePosixPath("/" + main).parent
            for pattern in imports:
                absolute = pattern if pattern.startswith("/") else str(base / pattern)
                if glob.has_magic(absolute):
                    found = glob.glob(str(self.root.join(absolute)))
                    files += [str(PurePosixPath(f).relative_to(self.root.path)) for f in found]
                elif not self.root.exists(absolute):
                    return f"import {absolute} does not exist"
                else:
                    files.append(absolute.lstrip("/"))
        else:
            directory = runtimes.CRIO_DROP_IN_DIR
            files = [
                runtimes.CRIO_CONFIG,
                *(f"{directory}/{n}" for n in self.root.list_dir(directory)),
            ]
        for relative in files:
            try:
                tomllib.loads(self.root.read_text(relative) or "")
            except tomllib.TOMLDecodeError as error:
                return f"{relative}: {error}"
        return None
