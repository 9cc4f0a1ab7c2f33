"""The `driver` section of the cluster policy: which driver versions the nodes should run.

`gpu` and `ofed` are the default drivers; `pools` gives groups of nodes (a node selector
each) drivers of their own, as upstream's NVIDIADriver custom resources do, with their own
`maxParallelUpgrades`, canary and pause under the cluster's one `maxUnavailable`. A node
runs the drivers of the pool whose selector matches its labels, or the defaults when none
does. Pools never overlap: two selectors that some node's labels could both match are
refused when the policy is read (`Valid=False` naming both pools and such labels), so a
node's pool never depends on the order of the list. A pool leaves a component it does not
set to the default (its version and source).

A change of `driver.gpu.version` or `driver.ofed.version` is what starts a rollout
(docs/saga-kinds.md); the orchestrator puts the version and source into the driver-manager commands
(`gpuop.events.driver.InstallDriver`), so the version syntax here is the one those commands
accept, and the source is one that driver-manager can read
(`gpuop.services.driver_manager.sources`): an absolute directory, a `file://` URL, or an
http(s) URL holding `index.json`.

`driver.gpu.kernelModuleType` (`auto`, `open`, `proprietary`, as upstream's) says which of
NVIDIA's kernel module trees the GPU driver runs; the orchestrator resolves `auto` per node
(`gpuop.policy.flavours`) and records the result in the node's saga.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from gpuop import selectors as selecting
from gpuop.events import driver
from gpuop.policy import deviceapis, parameters
from gpuop.policy.deviceapis import DeviceApiSetting
from gpuop.policy.fields import Section, matching
from gpuop.policy.selectors import LabelSelector
from gpuop.policy.upgrades import Canary

DEFAULT_POOL = "default"
"""How status and the CLI name the nodes no pool selects (a name no pool may take)."""
MAX_POOLS = 16
"""The most driver pools one policy may have."""
POOL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"
"""A pool's name: a DNS label of at most 32 characters (it appears in status and ids)."""

VERSION_PATTERN = r"^[0-9A-Za-z][0-9A-Za-z.+_~-]*$"
"""The driver version syntax, the same as `gpuop.events.fields.Version`."""
VERSION_MAX_LENGTH = 64
SOURCE_MAX_LENGTH = 2048
SOURCE_PATTERN = r"^(/|file:///|https?://[^/?#\s]+)"
"""A loose shape check for the CRD schema; `_check_source` is the full check."""

_VERSION = re.compile(VERSION_PATTERN)


def _check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise PydanticCustomError(
            "driver_version",
            'must be a version such as "580.105.08": letters, digits and ". + _ ~ -", '
            "starting with a letter or digit",
        )
    return version


def _check_source(source: str) -> str:
    if not _is_source(source):
        raise PydanticCustomError(
            "driver_source",
            "must be an absolute directory path, a file:// URL or an http(s) URL",
        )
    return source


def _is_source(source: str) -> bool:
    if any(char.isspace() for char in source):
        return False
    if source.startswith("/"):
        return True
    parts = urlsplit(source)
    if parts.scheme == "file":
        return parts.netloc == "" and parts.path.startswith("/")
    return parts.scheme in ("http", "https") and bool(parts.hostname)


DriverVersion = Annotated[
    str,
    Field(
        min_length=1,
        max_length=VERSION_MAX_LENGTH,
        json_schema_extra={"pattern": VERSION_PATTERN},
    ),
    AfterValidator(_check_version),
]
"""A driver version: `580.105.08`, `24.10-1.1.4.0`."""

DriverSource = Annotated[
    str,
    Field(
        min_length=1,
        max_length=SOURCE_MAX_LENGTH,
        json_schema_extra={"pattern": SOURCE_PATTERN},
    ),
    AfterValidator(_check_source),
]
"""Where driver packages come from: an absolute directory, `file://` or http(s) URL."""

SHA256_PATTERN = r"^[0-9a-f]{64}$"
PUBLIC_KEY_PATTERN = driver.MINISIGN_PUBLIC_KEY_PATTERN
"""A minisign public key: base64 of "Ed", the key id and the Ed25519 key (42 bytes); "Ed"
fixes its first characters."""


def _check_ca_bundle(bundle: str) -> str:
    if not (bundle.lstrip().startswith("-----BEGIN ") or bundle.startswith("/")):
        raise PydanticCustomError(
            "driver_ca_bundle",
            "must be PEM certificates (-----BEGIN CERTIFICATE-----...) or an absolute path",
        )
    return bundle


PublicKey = Annotated[
    str,
    Field(json_schema_extra={"pattern": PUBLIC_KEY_PATTERN}),
    matching(
        PUBLIC_KEY_PATTERN,
        'must be a minisign public key ("RW" and 54 more base64 characters, as '
        "`minisign -G` prints it)",
    ),
]
"""A minisign public key, `RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3`."""
CaBundle = Annotated[
    str,
    Field(min_length=1, max_length=driver.CA_BUNDLE_MAX_LENGTH),
    AfterValidator(_check_ca_bundle),
]
"""PEM CA certificates, or an absolute path to a PEM file on the node."""


def _listed(value: object) -> object:
    """A JSON list as the tuple the frozen, hashable policy keeps."""
    return tuple(value) if isinstance(value, list) else value


def _no_default(schema: dict[str, Any]) -> None:
    """Leave the default out of the CRD, so the API server stores no `pools: []` in a policy
    written without pools (and its wire form stays the same)."""
    schema.pop("default", None)


class ComponentSpec(Section):
    """The desired driver of one component (the GPU driver or the OFED driver)."""

    version: DriverVersion
    """The version every managed node should run: `580.105.08` for the GPU driver,
    `24.10-1.1.4.0` for OFED. Changing it starts a rolling upgrade (unless
    `upgradePolicy.autoUpgrade` is false)."""
    source: DriverSource | None = None
    """Where driver-manager fetches the packages: a directory holding `index.json` (an
    absolute path as the agent sees it, or a `file://` URL) or an http(s) URL. Unset: the
    source driver-manager was configured with."""
    public_keys: (
        Annotated[
            tuple[PublicKey, ...],
            Field(max_length=driver.MAX_PUBLIC_KEYS),
            BeforeValidator(_listed),
        ]
        | None
    ) = None
    """minisign public keys (`RW...`, as `minisign -G` prints them) trusted to sign the
    source's `index.json` (its `index.json.minisig`); an index signed by none of them is
    refused, and so is an unsigned one unless `allowUnsigned`. List the new key beside the old
    one while rotating. Unset: no key is trusted."""
    allow_unsigned: bool | None = None
    """True: install from an index without a signature, trusting the source and its
    transport alone (a warning is logged on every install). Never lifts the signature check
    over plain `http://`, nor accepts an index signed by an untrusted key. Unset: false."""
    ca_bundle: CaBundle | None = None
    """The CA certificates an https source's server certificate must chain to, in place of
    the node's trust store: PEM text, or an absolute path to a PEM file as the agent sees it.
    Unset: the node's trust store."""
    sha256: Annotated[str, Field(pattern=SHA256_PATTERN)] | None = None
    """The expected SHA-256 of the package (64 lower-case hex digits); the agent refuses a
    package, or a signed index entry, with another digest. A package is built per kernel, so
    set it only where every node the spec applies to runs the same kernel."""


KernelModuleType = Literal["auto", "open", "proprietary"]
"""Which of NVIDIA's kernel module trees the GPU driver uses, as upstream's
`driver.kernelModuleType`; `auto` is resolved per node by `gpuop.policy.flavours`."""


class GpuComponentSpec(ComponentSpec):
    """The desired NVIDIA GPU driver: a component, and which kernel modules it runs."""

    kernel_module_type: KernelModuleType = "auto"
    """Which kernel modules the nodes run: `open` (NVIDIA's open GPU kernel modules, Turing
    and later), `proprietary`, or `auto`, upstream's default: per node, `open` when one of
    its GPUs needs it (Blackwell and later, Grace Hopper), `proprietary` when one cannot run
    it (Volta and earlier), else `open` from driver branch 560 on and `proprietary` before
    (NVIDIA's installer's recommendation), judged from the node's inventory and this
    `version`. The flavour chosen is recorded in the node's saga. A node running the other
    flavour of the same version is reloaded, as for a version change; the driver source must
    have packages of the flavour (a format-1 package, which names none, serves either). A
    pool's `gpu` has its own (unset: `auto`)."""
    kernel_module_parameters: parameters.ModuleParameters | None = None
    """Parameters each of the GPU driver's modules is loaded with, by module (`nvidia`,
    `nvidia_uvm`, `nvidia_modeset`, `nvidia_drm`, `nvidia_peermem`) then parameter name:
    `{nvidia: {NVreg_EnableGpuFirmware: 0}}`. `gpuop upgrade start` refuses a parameter the
    package's module does not declare (`modinfo`'s `parm:`) or a value of another type.
    Changing them reloads the modules of every node they apply to, as a version change
    does. A pool's `gpu` has its own (unset: none)."""


def _gpu_spec(value: object) -> object:
    """A plain `ComponentSpec` given for a GPU driver in code (the CLI, tests) as the GPU's
    spec, with the default `kernelModuleType`."""
    if isinstance(value, ComponentSpec) and not isinstance(value, GpuComponentSpec):
        return GpuComponentSpec.model_validate(value.model_dump())
    return value


GpuSpec = Annotated[GpuComponentSpec, BeforeValidator(_gpu_spec)]
"""The `gpu` field of the defaults and of a pool."""


class PoolUpgradePolicy(Section):
    """How one pool's nodes are rolled; unset fields follow `upgradePolicy`."""

    max_parallel_upgrades: int | None = Field(default=None, ge=0, le=100_000)
    """How many of the pool's nodes may be upgraded at once (0: no limit); unset: the
    cluster's `upgradePolicy.maxParallelUpgrades`, applied to the pool on its own. Every pool
    also stays within the cluster's one `maxUnavailable`."""
    canary: Canary | None = None
    """The pool's canary: its first nodes are upgraded, and the pool's other nodes only once
    those are done; a failed canary holds this pool back, not the others. Unset: the
    cluster's `upgradePolicy.canary`, counted per pool (each pool's new driver proves itself
    on nodes of its own)."""
    paused: bool = False
    """Admit none of the pool's nodes (what `gpuop upgrade pause --pool` sets); the pool's
    sagas under way finish their upgrades, and the other pools go on."""


class DriverPool(Section):
    """A group of nodes with drivers of their own."""

    name: Annotated[str, Field(min_length=1, max_length=32, pattern=POOL_NAME_PATTERN)]
    """The pool's name: a DNS label (`h200-training`), unique among the pools."""
    node_selector: Annotated[LabelSelector, Field(min_length=1)]
    """The label selector of the pool's nodes (`nvidia.com/gpu.product=NVIDIA-H200`). It
    must not overlap another pool's: no node's labels may match both."""
    gpu: GpuSpec | None = None
    """The pool's GPU driver; unset: the default `driver.gpu`."""
    ofed: ComponentSpec | None = None
    """The pool's OFED driver; unset: the default `driver.ofed` (if any)."""
    upgrade_policy: PoolUpgradePolicy = PoolUpgradePolicy()
    """The pool's own parallelism, canary and pause."""
    device_api: DeviceApiSetting = Field(default=None, alias=deviceapis.FIELD)
    """Which kubelet API serves the pool's GPUs (`devicePlugin` or `dra`); unset: the
    top-level `deviceAPI`."""


class DriverSpec(Section):
    """The drivers gpuop manages on the nodes."""

    gpu: GpuSpec
    """The NVIDIA GPU kernel driver, on every node no pool selects."""
    ofed: ComponentSpec | None = None
    """The OFED (MLNX/DOCA) network driver; unset: gpuop leaves the OFED driver alone. A
    change of both versions is applied to a node in one maintenance window."""
    pools: Annotated[
        tuple[DriverPool, ...],
        Field(max_length=MAX_POOLS, json_schema_extra=_no_default),
        BeforeValidator(_listed),  # after Field, so the CRD says maxItems (not maxLength)
    ] = ()
    """Groups of nodes with drivers of their own (at most 16): a node whose labels match a
    pool's `nodeSelector` runs that pool's drivers, any other node the defaults above. All
    pools roll at once, each within its own `maxParallelUpgrades` and canary, together within
    the cluster's `maxUnavailable`."""

    @field_validator("pools")
    @classmethod
    def _disjoint(cls, pools: tuple[DriverPool, ...]) -> tuple[DriverPool, ...]:
        seen: dict[str, int] = {}
        for index, pool in enumerate(pools):
            if pool.name == DEFAULT_POOL:
                raise PydanticCustomError(
                    "driver_pool_name",
                    "name 'default' is reserved for the nodes no pool selects",
                    {"field": index},
                )
            if pool.name in seen:
                raise PydanticCustomError(
                    "driver_pool_name",
                    "name '{name}' is used by pools[{first}] too: pool names must be unique",
                    {"field": index, "name": pool.name, "first": seen[pool.name]},
                )
            seen[pool.name] = index
        parsed = [selecting.parse(pool.node_selector) for pool in pools]
        for index, pool in enumerate(pools):
            for earlier in range(index):
                both = selecting.common_labels(parsed[earlier], parsed[index])
                if both is not None:
                    other = pools[earlier]
                    labels = ",".join(f"{k}={v}" for k, v in both.items()) or "any labels"
                    raise PydanticCustomError(
                        "driver_pool_overlap",
                        "pools '{first}' and '{second}' overlap: a node labelled {labels} matches "
                        "both nodeSelectors ('{first_selector}' and '{second_selector}'); make "
                        "them exclusive",
                        {
                            "field": index,
                            "first": other.name,
                            "second": pool.name,
                            "labels": labels,
                            "first_selector": other.node_selector,
                            "second_selector": pool.node_selector,
                        },
                    )
        return pools

    def pool_for(self, labels: Mapping[str, str]) -> DriverPool | None:
        """The pool whose selector matches `labels` (at most one: pools never overlap)."""
        return next(
            (p for p in self.pools if selecting.matches(selecting.parse(p.node_selector), labels)),
            None,
        )

    def pool(self, name: str | None) -> DriverPool | None:
        """The pool called `name`; None for None (the defaults). `KeyError` for a name no
        pool has."""
        if name is None:
            return None
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no driver pool {name!r} (pools: {[p.name for p in self.pools]})")

    def components_of(self, name: str | None) -> tuple[GpuComponentSpec, ComponentSpec | None]:
        """The GPU and OFED drivers of the pool called `name` (None: the defaults), a
        component the pool leaves unset being the default's."""
        pool = self.pool(name)
        if pool is None:
            return self.gpu, self.ofed
        return pool.gpu or self.gpu, pool.ofed or self.ofed
