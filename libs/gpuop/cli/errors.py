"""How a `gpuop` command fails, and the exit code `gpuop.cli.main` gives each failure:

    ValueError, SettingsError, UnknownService   2  bad usage or input; the message names
                                                   the flag (argparse's own errors exit 2)
    CommandFailed                               1  the operation could not be done: no
                                                   policy, nothing to abort, refused
    BusError                                    1  NATS unreachable or refusing
    KubeError                                   1  the API server unreachable or refusing
    KeyboardInterrupt                         130  Ctrl-C

Every message goes to standard error as `gpuop <command>: <message>`.
"""

from __future__ import annotations


class CommandFailed(Exception):
    """The command could not do what it was asked; the message says why and what to do."""
