"""Driver commands to one node's driver-manager, and the result it publishes for each.

The upgrade orchestrator sends the commands (subject `gpuop.cmd.driver-manager.<node>.<verb>`)
while a node's saga is in `driver-reload-required`, `reboot-required`, `validation-required`
or `rollback-required`, and `StageDriver` in `cordon-required` before the node is cordoned.
The driver-manager on that node executes them idempotently by command id and answers every
command with one result event in domain `driver`, which carries the id of the command it
answers (`command_id`) and the driver component, so the
orchestrator's decision core can match the answer to the saga step that asked.

A failure event says whether the agent expects a retry of the same command to help
(`retryable`); the decision core combines that with the policy to retry, reboot, roll back or
fail the node.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, Field, StringConstraints

from gpuop.events.envelope import Command, Event
from gpuop.events.fields import (
    BootId,
    Count,
    DocumentedEnum,
    GpuUuid,
    KernelRelease,
    Message,
    MessageId,
    ModuleName,
    NamespacedName,
    Record,
    Sha256,
    TimeoutSeconds,
    Version,
)

SERVICE = "driver-manager"

ParameterName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
"""A module parameter's name, as `module_param` declares it: `NVreg_EnableGpuFirmware`."""
ParameterValue = Annotated[str, StringConstraints(pattern=r"^[^\s\"'\\]{0,1024}$")]
"""A module parameter's value as modprobe takes it and sysfs shows it: `0`, `Y`, `a=1;b=2`."""
ModuleParameters = Annotated[
    dict[ModuleName, Annotated[dict[ParameterName, ParameterValue], Field(max_length=64)]],
    Field(max_length=16),
]
"""Module name to its parameters: `{"nvidia": {"NVreg_EnableGpuFirmware": "0"}}`."""


def hash_with_parameters(self: BaseModel) -> int:
    """An event's hash where a field is a `ModuleParameters` mapping: events are hashable
    (kept in sets and as keys), and a dict is not."""
    return hash((type(self), tuple((k, _hashable(v)) for k, v in self.__dict__.items())))


def _hashable(value: object) -> object:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


class Component(DocumentedEnum):
    """Which driver stack a command or result is about; upstream's `<drv>` names."""

    GPU = "gpu"
    """The NVIDIA GPU kernel driver (`nvidia`, `nvidia_uvm`, `nvidia_modeset`, ...)."""
    OFED = "ofed"
    """The Mellanox OFED / DOCA network driver (`mlx5_core`, `mlx5_ib`, `ib_core`, ...)."""


class Flavour(DocumentedEnum):
    """Which of NVIDIA's two kernel module trees a GPU driver's modules are built from (the
    policy's `driver.gpu.kernelModuleType`, resolved per node)."""

    OPEN = "open"
    """NVIDIA's open modules (`kernel-open`): Turing on; the only kind Blackwell runs."""
    PROPRIETARY = "proprietary"
    """The proprietary modules (`kernel`): the only kind Volta and older run."""


class DriverStep(DocumentedEnum):
    """One step the driver-manager executes."""

    UNLOAD = "unload"
    """Remove the kernel modules in dependency order."""
    INSTALL = "install"
    """Fetch, verify and install a driver package."""
    LOAD = "load"
    """Load the installed driver's kernel modules."""
    VALIDATE = "validate"
    """Check that the loaded driver works: version, devices, health."""


class UnloadFailureReason(DocumentedEnum):
    """Why the modules could not be unloaded."""

    IN_USE = "in-use"
    """Processes or other modules still hold the driver (see the holders)."""
    TIMEOUT = "timeout"
    """The holders did not go away within the command's timeout."""
    MANAGEMENT_INTERFACE = "management-interface"
    """Refused: the NIC driver serves the node's management path and no opt-in was given."""
    MODULE_ERROR = "module-error"
    """`rmmod`/`modprobe -r` failed for a reason other than use."""
    OTHER = "other"
    """Anything else; see the message."""


class InstallFailureReason(DocumentedEnum):
    """Why a driver package could not be installed."""

    SOURCE_UNREACHABLE = "source-unreachable"
    """The driver source did not answer; retrying later may help."""
    NOT_FOUND = "not-found"
    """The source has no package of that version for this kernel and OS."""
    VERIFICATION_FAILED = "verification-failed"
    """The package's digest or signature did not match."""
    BUILD_FAILED = "build-failed"
    """Building the modules for the running kernel failed."""
    NO_SPACE = "no-space"
    """The host ran out of disk space."""
    KERNEL_MISMATCH = "kernel-mismatch"
    """The package's modules were built for another kernel (their vermagic)."""
    UNSIGNED_MODULE = "unsigned-module"
    """The host loads only signed modules (lockdown, Secure Boot) and one is not signed."""
    OTHER = "other"
    """Anything else; see the message."""


class LoadFailureReason(DocumentedEnum):
    """Why the driver could not be loaded or validated."""

    MODULE_ERROR = "module-error"
    """`modprobe` failed."""
    VERSION_MISMATCH = "version-mismatch"
    """A different driver version than requested is loaded."""
    NO_DEVICES = "no-devices"
    """The driver loaded but sees fewer devices than the inventory lists."""
    UNHEALTHY = "unhealthy"
    """Devices report errors (XID, uncorrectable ECC) or NVML fails."""
    TIMEOUT = "timeout"
    """The step did not finish within the command's timeout."""
    CUDA_FAILED = "cuda-failed"
    """The CUDA probe failed (a CUDA error, named in the message) or hung past its timeout."""
    PEERMEM_NOT_REGISTERED = "peermem-not-registered"
    """`nvidia_peermem` is not loaded or not registered with the RDMA core."""
    OTHER = "other"
    """Anything else; see the message."""


class ValidationCheck(DocumentedEnum):
    """The rung of the validation ladder a `ValidateDriver` asks for."""

    NVML = "nvml"
    """The module's version, the user space equal to it, and NVML seeing the devices."""
    CUDA = "cuda"
    """`cuInit`, the device count and a context on every GPU, from the installed libcuda."""
    PEERMEM = "peermem"
    """`nvidia_peermem` loaded and registered with the RDMA core (GPUDirect RDMA)."""


MINISIGN_PUBLIC_KEY_PATTERN = r"^RW[Q-T][A-Za-z0-9+/]{53}$"
"""A minisign public key as `minisign -G` prints it: base64 of 42 bytes, `RW...`."""
MAX_PUBLIC_KEYS = 8
"""Trusted keys per driver source: enough to rotate keys without a gap."""
CA_BUNDLE_MAX_LENGTH = 32768
"""A PEM bundle of a few CA certificates, or a path."""

MinisignPublicKey = Annotated[str, StringConstraints(pattern=MINISIGN_PUBLIC_KEY_PATTERN)]
"""A minisign Ed25519 public key, `RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3`."""
CaBundle = Annotated[str, StringConstraints(min_length=1, max_length=CA_BUNDLE_MAX_LENGTH)]
"""PEM certificates (text starting `-----BEGIN CERTIFICATE-----`) or an absolute path to a
PEM file on the node."""


class DriverSource(Record):
    """Where a driver package comes from, and how to check it."""

    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    """Package or repository location: an `https://` URL, an OCI image reference, a host path."""
    sha256: Sha256 | None = None
    """Expected digest of the package; the agent refuses a package that does not match, and
    one whose signed index lists another digest."""
    public_keys: tuple[MinisignPublicKey, ...] = Field(default=(), max_length=MAX_PUBLIC_KEYS)
    """minisign public keys the source's `index.json.minisig` must be signed with (any one
    of them); the agent believes no digest of an index none of them signed."""
    allow_unsigned: bool = False
    """Accept an index without a signature (a warning is logged each install); an index
    signed but not by a trusted key is still refused, and so is any unsigned index over
    plain `http://`."""
    ca_bundle: CaBundle | None = None
    """The CA certificates an `https://` source's certificate must chain to, instead of the
    node's trust store: PEM text, or an absolute path to a PEM file on the node."""


class Process(Record):
    """A process that holds a driver's device files."""

    pid: Annotated[int, Field(ge=1, le=2**22)]
    """Process id on the host."""
    name: Annotated[str, StringConstraints(max_length=64)]
    """Command name (`/proc/<pid>/comm`)."""
    gpu_uuid: GpuUuid | None = None
    """GPU it uses, when known."""
    pod: NamespacedName | None = None
    """Pod it belongs to, when it runs in one."""


# Commands. Every command names its component; the agent rejects one it does not manage.


class UnloadDriver(Command):
    """Unload the component's kernel modules, waiting up to `timeout_seconds` for holders."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "unload"

    component: Component
    """Driver stack to unload."""
    timeout_seconds: TimeoutSeconds = 300
    """How long to wait for holders to let go before reporting failure."""
    allow_management_interface: bool = False
    """Opt-in to reload a NIC driver that carries the node's management traffic."""


class InstallDriver(Command):
    """Fetch, verify and install `version` of the component from `source`; do not load it."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "install"

    component: Component
    """Driver stack to install."""
    version: Version
    """Driver version to install."""
    source: DriverSource
    """Where the package comes from."""
    flavour: Flavour | None = None
    """The GPU driver's kernel module tree: the source's package of that flavour is installed,
    and none of another (a format-1 package, which names none, serves either). Absent: the
    first package the source lists for the kernel, whatever its flavour."""
    timeout_seconds: TimeoutSeconds = 1800
    """How long fetching and building may take."""


class StageDriver(Command):
    """Fetch and verify `version` of the component from `source`, check that this node's
    kernel takes its modules, and keep it in staging on the host; install nothing. Sent
    before the node is cordoned, so a package that cannot be installed fails the node while
    its workloads still run; the later `InstallDriver` installs the staged copy."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "stage"

    component: Component
    """Driver stack to stage."""
    version: Version
    """Driver version to stage."""
    source: DriverSource
    """Where the package comes from, and how to check it (as for `InstallDriver`)."""
    flavour: Flavour | None = None
    """The kernel module tree to stage, as for `InstallDriver`."""
    timeout_seconds: TimeoutSeconds = 900
    """How long fetching and checking may take."""


class LoadDriver(Command):
    """Load the installed `version` of the component."""

    __hash__ = hash_with_parameters
    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "load"

    component: Component
    """Driver stack to load."""
    version: Version
    """Driver version expected to load; a different one is a failure."""
    timeout_seconds: TimeoutSeconds = 300
    """How long loading may take."""
    parameters: ModuleParameters = Field(default_factory=dict)
    """The parameters each module is loaded with (the policy's `kernelModuleParameters`);
    empty: none."""


class ValidateDriver(Command):
    """Check that `version` of the component is loaded and every device works."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "validate"

    component: Component
    """Driver stack to validate."""
    version: Version
    """Driver version that must be running."""
    expected_devices: Count | None = None
    """Devices the driver must see (GPUs, or ConnectX functions); absent to accept any."""
    timeout_seconds: TimeoutSeconds = 600
    """How long validation may take."""
    check: ValidationCheck = ValidationCheck.NVML
    """The rung to run; absent: the NVML rung (what a ValidateDriver always meant)."""


class RollbackDriver(Command):
    """Return the component to `version`: unload what runs, reinstall if needed, load."""

    __hash__ = hash_with_parameters
    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "rollback"

    component: Component
    """Driver stack to roll back."""
    version: Version
    """Previous driver version to return to."""
    source: DriverSource | None = None
    """Where to fetch it if the agent no longer has the package."""
    flavour: Flavour | None = None
    """The kernel modules the GPU driver ran before: the version installed with the other
    ones (a flavour change of the same version) is installed again with these. Absent: the
    version as it is installed."""
    timeout_seconds: TimeoutSeconds = 1800
    """How long the whole rollback may take."""
    parameters: ModuleParameters = Field(default_factory=dict)
    """The parameters the modules ran with before, loaded with them again; empty: none."""


class RebootNode(Command):
    """Reboot the node, unless it already rebooted since the orchestrator decided to."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "reboot"

    boot_id: BootId
    """Boot id the decision was made in. The agent reboots only while it is still current, so a
    command redelivered after the reboot is dropped (discovery's new boot id is the answer)."""
    reason: Message = ""
    """Why the node reboots, for the journal and the event log."""


# Results.


class DriverResult(Event):
    """Base of the driver-manager's answers: which command, which component."""

    DOMAIN: ClassVar[str] = "driver"

    command_id: MessageId
    """Envelope id of the command this answers."""
    component: Component
    """Driver stack the command was about."""


class DriverFailure(DriverResult):
    """Base of the failure answers."""

    message: Message = ""
    """What went wrong, for operators."""
    retryable: bool = False
    """True when the agent expects the same command to succeed later (a transient cause)."""


class DriverUnloaded(DriverResult):
    """The component's modules are unloaded (or none was loaded)."""

    NAME: ClassVar[str] = "unloaded"

    version: Version | None = None
    """Version that was loaded before; absent when nothing was loaded."""
    modules: tuple[ModuleName, ...] = Field(default=(), max_length=64)
    """Modules removed, in the order they were removed."""


class DriverUnloadFailed(DriverFailure):
    """The component's modules could not be unloaded; the node still runs the old driver."""

    NAME: ClassVar[str] = "unload-failed"

    reason: UnloadFailureReason
    """Why the unload failed."""
    holding_modules: tuple[ModuleName, ...] = Field(default=(), max_length=64)
    """Other modules that still use the driver's modules."""
    holding_processes: tuple[Process, ...] = Field(default=(), max_length=256)
    """Processes that still hold the driver's device files (the first 256)."""


class DriverInstalled(DriverResult):
    """The package is installed and ready to load."""

    NAME: ClassVar[str] = "installed"

    version: Version
    """Installed version."""
    sha256: Sha256 | None = None
    """Digest of the package that was installed."""
    flavour: Flavour | None = None
    """The installed modules' tree, as the package's manifest names it; absent for a
    format-1 package, which names none."""
    prestaged_kernels: tuple[KernelRelease, ...] = Field(default=(), max_length=32)
    """The host's other kernels (under `/lib/modules`) the version was installed for too,
    so a reboot into one comes up with the driver."""
    kernels_without_package: tuple[KernelRelease, ...] = Field(default=(), max_length=32)
    """The host's other kernels the version could not be installed for (the source has no
    package for them, or it failed a check; the agent's log says which): a reboot into one
    comes up without a driver, and the orchestrator reinstalls it (`kernel-drift`)."""


class DriverInstallFailed(DriverFailure):
    """The package could not be installed; the previous installation is untouched."""

    NAME: ClassVar[str] = "install-failed"

    version: Version
    """Version that was asked for."""
    reason: InstallFailureReason
    """Why the install failed."""


class DriverStaged(DriverResult):
    """The package is fetched, verified and checked, and waits in staging for the install."""

    NAME: ClassVar[str] = "staged"

    version: Version
    """Staged version."""
    sha256: Sha256 | None = None
    """Digest of the staged package; absent when the version is installed already."""


class DriverStageFailed(DriverFailure):
    """The package could not be staged; nothing on the node changed."""

    NAME: ClassVar[str] = "stage-failed"

    version: Version
    """Version that was asked for."""
    reason: InstallFailureReason
    """Why staging failed (the install's reasons: not found, verification, kernel)."""


class DriverLoaded(DriverResult):
    """The driver is loaded."""

    __hash__ = hash_with_parameters
    NAME: ClassVar[str] = "loaded"

    version: Version
    """Loaded version."""
    modules: tuple[ModuleName, ...] = Field(default=(), max_length=64)
    """Modules now loaded, in load order."""
    parameters: ModuleParameters = Field(default_factory=dict)
    """The parameters the load asked for, each as the module shows it now
    (`/sys/module/<module>/parameters/`); one the module took none of is left out."""


class DriverLoadFailed(DriverFailure):
    """The driver could not be loaded."""

    NAME: ClassVar[str] = "load-failed"

    version: Version
    """Version that was asked for."""
    reason: LoadFailureReason
    """Why the load failed."""


class DriverValidated(DriverResult):
    """The driver runs the expected version and every device works."""

    NAME: ClassVar[str] = "validated"

    version: Version
    """Validated version."""
    devices: Count
    """Devices the driver sees."""


class DriverValidationFailed(DriverFailure):
    """The loaded driver is not usable."""

    NAME: ClassVar[str] = "validation-failed"

    version: Version
    """Version that was expected."""
    reason: LoadFailureReason
    """Why validation failed."""
    failing_gpus: tuple[GpuUuid, ...] = Field(default=(), max_length=64)
    """GPUs that failed their checks."""


class DriverRolledBack(DriverResult):
    """The component runs the previous version again."""

    NAME: ClassVar[str] = "rolled-back"

    version: Version
    """Version now loaded (the one rolled back to)."""
    from_version: Version | None = None
    """Version that was loaded before the rollback, when any was."""
    restored_kernels: tuple[KernelRelease, ...] = Field(default=(), max_length=32)
    """The host's other kernels that pre-staging had given the version rolled back from,
    made to boot the version they had before again (or none, when they had none)."""
    kernels_not_restored: tuple[KernelRelease, ...] = Field(default=(), max_length=32)
    """The host's other kernels whose version from before pre-staging could not be made
    active again (gone from disk; the agent's log says why): the version rolled back from
    is taken off them, so a reboot into one comes up without a driver and is reinstalled."""


class DriverRollbackFailed(DriverFailure):
    """The rollback did not complete; the node needs an operator."""

    NAME: ClassVar[str] = "rollback-failed"

    version: Version
    """Version the rollback aimed for."""
    failed_step: DriverStep
    """Step of the rollback that failed."""


class RebootStarted(Event):
    """The agent is rebooting the node; discovery confirms it with a new boot id."""

    DOMAIN: ClassVar[str] = "driver"
    NAME: ClassVar[str] = "reboot-started"

    command_id: MessageId
    """Envelope id of the `RebootNode` command this answers."""
    boot_id: BootId
    """Boot id before the reboot."""


# The container runtime: the `nvidia` handler with CDI, applied in the maintenance window.

ContainerRuntimeKind = Annotated[str, StringConstraints(pattern=r"^(containerd|crio)$")]
"""The runtime a node's drop-in is for: `containerd` or `crio`."""
HostPath = Annotated[str, StringConstraints(pattern=r"^/[^\x00]{0,1023}$")]
"""An absolute path on the host."""


class RuntimeFailureReason(DocumentedEnum):
    """Why the container runtime could not be configured."""

    NOT_FOUND = "not-found"
    """The node has no containerd or CRI-O configuration to add the handler to."""
    UNREADABLE = "unreadable"
    """A runtime configuration file does not parse; the message names the file and line."""
    RESTART_FAILED = "restart-failed"
    """The runtime could not be restarted with the drop-in; the earlier files are back."""
    NOT_ANSWERING = "not-answering"
    """The restarted runtime did not answer its socket in time; the earlier files are back."""


class ConfigureRuntime(Command):
    """Add the `nvidia` runtime handler with CDI to the node's container runtime: write its
    drop-in (and the import line), restart the runtime and confirm it answers on its socket
    within `timeout_seconds`; put the earlier files back and restart again if it does not.
    Nothing is written or restarted when the drop-in is as it should be. Sent after the loads,
    while the node is cordoned and drained, so the restart is under no running pod."""

    SERVICE: ClassVar[str] = SERVICE
    VERB: ClassVar[str] = "configure-runtime"

    component: Component = Component.GPU
    """The driver stack the handler serves (the GPU's)."""
    runtime_path: HostPath | None = None
    """The handler's OCI runtime binary; absent: a copy of the runtime's default one, which
    injects CDI devices itself."""
    timeout_seconds: TimeoutSeconds = 300
    """How long the restarted runtime may take to answer."""


class RuntimeConfigured(DriverResult):
    """The node's container runtime has the `nvidia` handler with CDI, and answers."""

    NAME: ClassVar[str] = "runtime-configured"

    runtime: ContainerRuntimeKind
    """The runtime configured."""
    drop_in: HostPath
    """The drop-in that holds the handler: `/etc/containerd/conf.d/99-nvidia.toml`."""
    changed: bool
    """Whether files were written and the runtime restarted (false: it was configured)."""
    config_version: int | None = Field(default=None, ge=2, le=3)
    """containerd's config schema of the drop-in (2 for 1.6 and 1.7, 3 for 2.x)."""
    restart_seconds: float | None = Field(default=None, ge=0)
    """How long the restarted runtime took to answer again."""


class RuntimeConfigureFailed(DriverFailure):
    """The container runtime could not be given the `nvidia` handler."""

    NAME: ClassVar[str] = "runtime-configure-failed"

    reason: RuntimeFailureReason
    """Why."""
    restored: bool = True
    """Whether the runtime runs with its earlier configuration again (false: it was written
    back, but the runtime does not answer with it either)."""
