"""driver-manager: executes driver commands on its node (unload, install, load, validate,
rollback, reboot), idempotently by command id, and publishes the result of each.

    agent        the bus side: consumer, idempotency, result events; `main`
    executor     one command to one result
    installing   fetch, verify, stage, rename, depmod; cleaning up after a crash
    sources      driver sources: a directory or an http(s) URL holding index.json
    reloading    unload in dependency order, load a selected version
    holders      who keeps a driver in use; which NIC carries the management path
    validating   NVML (GPU) or sysfs (OFED) checks of a loaded driver
    rebooting    systemd on a real host, SimKernel.reboot on a simulated one
    state        driver-state.json: command records and per-component versions
    config       the --config file
"""

from gpuop.runtime.services import ServiceDefinition
from gpuop.runtime.settings import Role
from gpuop.services.driver_manager.agent import main

SERVICE = ServiceDefinition(
    name="driver-manager",
    summary="runs driver unload/install/load/validate/rollback/reboot commands",
    roles=frozenset({Role.NODE}),
    main=main,
)
