"""The driver-manager's own trust anchor: which driver sources, signing keys and versions
this node accepts, whatever a command names.

A command (`InstallDriver`, `StageDriver`, a rollback's source) comes over the bus, so
whoever can publish one could otherwise choose the source and the keys that vouch for it. The
anchor is read from the agent's own `--config` file (the ConfigMap the chart mounts, under
`trust:`), never from the bus, and `Installer` passes every source through `admit` before
opening it:

    the command names                             answer
    a URI under none of `sources`                 refused
    a key the anchor does not list                refused
    allowUnsigned, the anchor allows none         refused
    a CA bundle other than the anchor's           refused
    no keys                                       the anchor's keys
    a version under `min_versions`                refused (`check_version`): no downgrade
                                                  to an old, once-signed driver

and `verifying` refuses a signed index older than `max_index_age_seconds` (its trusted
comment's `timestamp:`), so an old index replayed by a mirror is not believed either.

Every refusal is an `AnchorRefusal`, which the installer reports as `verification-failed`
in the command's failure event, with the message below.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpuop.events import driver as dm
from gpuop.events.fields import Version

REFUSED = "refused by this node's driver trust anchor (the driver-manager's config, trust:)"


class AnchorRefusal(Exception):
    """A command asked for a source, key, trust or version the node's anchor does not grant."""


class TrustAnchor(BaseModel):
    """The `trust:` section of the driver-manager's config. The defaults trust nothing: a
    node installs no driver until an admin lists its sources and keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    public_keys: tuple[dm.MinisignPublicKey, ...] = Field(default=(), max_length=16)
    """minisign public keys (`RW...`) a driver index may be signed with; a command may
    narrow them, never add one."""
    sources: tuple[Annotated[str, StringConstraints(min_length=1, max_length=2048)], ...] = ()
    """URI prefixes a command's source must start with, credentials aside
    (`https://mirror.example/drivers/`, `/host/srv/drivers/`: end each with `/`, or
    `https://mirror.example` admits `https://mirror.example.attacker.net`); none listed, no
    source is allowed."""
    allow_unsigned: bool = False
    """Whether a command may ever install from an unsigned index (`allowUnsigned`)."""
    ca_bundle: dm.CaBundle | None = None
    """The CA an https source must chain to; a command naming another one is refused."""
    min_versions: dict[dm.Component, Version] = Field(default_factory=dict)
    """Per component, the oldest version an install or stage may take."""
    max_index_age_seconds: Annotated[float, Field(gt=0)] | None = None
    """A signed index whose trusted comment's timestamp is older than this is refused."""


def admit(anchor: TrustAnchor, source: dm.DriverSource) -> dm.DriverSource:
    """`source` as the node will use it (the anchor's keys and CA, unsigned only where both
    allow it); `AnchorRefusal` naming what the command asked for that the anchor refuses."""
    plain = without_credentials(source.uri)
    if ".." in PurePosixPath(urlsplit(plain).path).parts:
        raise AnchorRefusal(f"{REFUSED}: source {plain} climbs out of its prefix (`..`)")
    directory = plain.rstrip("/") + "/"  # `/srv/drivers` is the prefix `/srv/drivers/`'s
    if not any(directory.startswith(prefix) for prefix in anchor.sources):
        allowed = ", ".join(anchor.sources) or "none"
        raise AnchorRefusal(
            f"{REFUSED}: source {plain} is under no allowed source prefix (allowed: {allowed})"
        )
    foreign = [key for key in source.public_keys if key not in anchor.public_keys]
    if foreign:
        raise AnchorRefusal(f"{REFUSED}: the command names untrusted key {foreign[0]}")
    if source.allow_unsigned and not anchor.allow_unsigned:
        raise AnchorRefusal(f"{REFUSED}: the command allows an unsigned index, the node never")
    if source.ca_bundle is not None and source.ca_bundle != anchor.ca_bundle:
        raise AnchorRefusal(f"{REFUSED}: the command names a CA bundle the node does not trust")
    return source.model_copy(
        update={
            "public_keys": source.public_keys or anchor.public_keys,
            "ca_bundle": anchor.ca_bundle,
        }
    )


def named_at_the_host(anchor: TrustAnchor, source: dm.DriverSource) -> TrustAnchor:
    """`anchor` trusting exactly `source`'s URI, keys, opt-out and CA, its floor and maximum
    age kept: the break glass (`gpuop driver`), where an admin at the host names them on the
    command line instead of a command on the bus."""
    return anchor.model_copy(
        update={
            "public_keys": source.public_keys,
            "sources": (without_credentials(source.uri),),
            "allow_unsigned": source.allow_unsigned,
            "ca_bundle": source.ca_bundle,
        }
    )


def without_credentials(uri: str) -> str:
    """`uri` without a URL's `user:password@`: a prefix names a place, not an account."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def check_version(anchor: TrustAnchor, component: str, version: str) -> None:
    """`AnchorRefusal` when `version` of `component` is older than the anchor's floor."""
    floor = anchor.min_versions.get(dm.Component(component))
    if floor is not None and version_key(version) < version_key(floor):
        raise AnchorRefusal(
            f"{REFUSED}: {component} {version} is older than the node's floor {floor}"
        )


def version_key(version: str) -> tuple[int, ...]:
    """`580.159.04` as (580, 159, 4): driver versions compare number by number."""
    return tuple(int(number) for number in re.findall(r"\d+", version))


def signed_at(trusted_comment: str) -> float | None:
    """The `timestamp:<seconds>` a minisign trusted comment carries; None without one."""
    found = re.search(r"(?:^|\t)timestamp:(\d{1,12})(?:\t|$)", trusted_comment)
    return float(found.group(1)) if found else None
