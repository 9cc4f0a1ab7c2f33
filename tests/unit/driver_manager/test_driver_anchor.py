"""Attack: whoever can publish a driver-manager command chooses the driver and its trust.

The attacker holds a credential that may publish `InstallDriver`/`StageDriver` (an
orchestrator's, or a node's own pod) and a web server or directory of their own. The node's
anchor (the driver-manager's config, `trust:`) lists one source, the simulation's key, a floor
for the GPU driver and a maximum index age. Every attempt below must end in a
`DriverInstallFailed`/`DriverStageFailed` event saying the anchor refused it, with nothing
installed; the same command within the anchor installs. Each attempt's outcome is printed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import packages, packaging, signing
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager.anchors import TrustAnchor
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop_sim.host import keys
from tests.support.driver_manager import (
    KERNEL,
    NEW,
    OLD,
    Harness,
    build_source,
    running_agent,
    source_of,
)

pytestmark = pytest.mark.security

FLOOR = "580.100.00"
"""The anchor's GPU floor: `OLD` (580.159.04) and `NEW` pass it, `ANCIENT` does not."""
ANCIENT = "550.54.15"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
"""The agents' virtual clock starts here (`VirtualClock`)."""
MAX_AGE = 7 * 86400


def anchor(source: Path) -> TrustAnchor:
    return TrustAnchor(
        public_keys=(keys.PUBLIC_KEY,),
        sources=(f"{source}/",),
        min_versions={dm.Component.GPU: FLOOR},
        max_index_age_seconds=MAX_AGE,
    )


def sign_at(directory: Path, key: signing.SecretKey, when: float) -> None:
    comment = f"timestamp:{int(when)}\tfile:{packaging.INDEX}\thashed"
    packaging.sign_driver_source(directory, key, trusted_comment=comment)


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    """The admin's mirror, signed today by the simulation's key, with an ancient build too."""
    directory = tmp_path / "mirror"
    packaging.build_driver_source(
        directory,
        [("gpu", OLD, KERNEL), ("gpu", NEW, KERNEL), ("gpu", ANCIENT, KERNEL)],
        signing_key=keys.SIGNING_KEY,
    )
    sign_at(directory, keys.SIGNING_KEY, NOW.timestamp())
    return directory


@pytest.fixture
async def anchored(bus: InMemoryBus, host: HostRoot, mirror: Path) -> AsyncIterator[Harness]:
    config = DriverManagerConfig(trust=anchor(mirror))
    async with running_agent(bus, host, mirror, config) as running:
        yield running


def install(source: dm.DriverSource, version: str = NEW) -> dm.InstallDriver:
    return dm.InstallDriver(component=dm.Component.GPU, version=version, source=source)


def outcome(answer: dm.DriverInstalled | dm.DriverInstallFailed | object) -> str:
    if isinstance(answer, dm.DriverInstallFailed | dm.DriverStageFailed):
        return f"{type(answer).__name__} ({answer.reason}): {answer.message}"
    return type(answer).__name__


async def test_a_command_cannot_choose_the_source_the_key_or_the_trust(
    anchored: Harness, host: HostRoot, mirror: Path, tmp_path: Path
) -> None:
    attacker = signing.SecretKey.generate()
    evil = tmp_path / "evil"
    build_source(evil)
    sign_at(evil, attacker, NOW.timestamp())
    unsigned = tmp_path / "unsigned"
    build_source(unsigned)
    (unsigned / (packaging.INDEX + signing.SUFFIX)).unlink()
    sibling = Path(f"{mirror}-copy")
    build_source(sibling)
    attempts = [
        ("another source, the trusted key", source_of(evil), "no allowed source prefix"),
        ("a prefix's sibling directory", source_of(sibling), "no allowed source prefix"),
        ("the prefix, then ..", source_of(f"{mirror}/../evil"), "climbs out of its prefix"),
        (
            "the mirror, the attacker's key",
            dm.DriverSource(uri=str(mirror), public_keys=(attacker.public_key.to_base64(),)),
            "untrusted key",
        ),
        (
            "another source, the attacker's key",
            dm.DriverSource(uri=str(evil), public_keys=(attacker.public_key.to_base64(),)),
            "no allowed source prefix",
        ),
        (
            "the mirror, allowUnsigned",
            dm.DriverSource(uri=str(mirror), allow_unsigned=True),
            "unsigned index, the node never",
        ),
        (
            "the mirror, a CA of the attacker's",
            source_of(mirror).model_copy(update={"ca_bundle": "/host/tmp/evil-ca.pem"}),
            "CA bundle the node does not trust",
        ),
    ]
    print("\nInstallDriver naming its own trust, against the node's anchor:")
    for what, source, expected in attempts:
        answer = await anchored.send(install(source))
        print(f"  {what:<38} -> {outcome(answer)}")
        assert isinstance(answer, dm.DriverInstallFailed), answer
        assert answer.reason is dm.InstallFailureReason.VERIFICATION_FAILED
        assert "trust anchor" in answer.message and expected in answer.message
        assert not answer.retryable
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)
    answer = await anchored.send(install(dm.DriverSource(uri=str(mirror))))
    print(f"  {'the mirror, no keys named (the anchor)':<38} -> {outcome(answer)}")
    assert isinstance(answer, dm.DriverInstalled), answer
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD, NEW)


async def test_a_downgrade_or_a_replayed_old_index_is_refused(
    anchored: Harness, host: HostRoot, mirror: Path
) -> None:
    print("\nold drivers and old indexes, signed by the trusted key:")
    for command in (
        install(source_of(mirror), ANCIENT),
        dm.StageDriver(component=dm.Component.GPU, version=ANCIENT, source=source_of(mirror)),
    ):
        answer = await anchored.send(command)
        print(f"  {type(command).__name__} {ANCIENT} (floor {FLOOR}) -> {outcome(answer)}")
        assert isinstance(answer, dm.DriverInstallFailed | dm.DriverStageFailed), answer
        assert f"older than the node's floor {FLOOR}" in answer.message
    for age, what in ((MAX_AGE + 3600, "signed 8 days ago"), (None, "no timestamp")):
        if age is None:
            packaging.sign_driver_source(mirror, keys.SIGNING_KEY, trusted_comment="replayed")
        else:
            sign_at(mirror, keys.SIGNING_KEY, NOW.timestamp() - age)
        answer = await anchored.send(install(source_of(mirror)))
        print(f"  a replayed index, {what:<17} -> {outcome(answer)}")
        assert isinstance(answer, dm.DriverInstallFailed), answer
        assert "a replayed old index is not believed" in answer.message
    assert packages.installed_versions(host, KERNEL, "gpu") == (OLD,)
    sign_at(mirror, keys.SIGNING_KEY, NOW.timestamp() - 3600)
    answer = await anchored.send(install(source_of(mirror)))
    print(f"  {'the mirror signed an hour ago':<37} -> {outcome(answer)}")
    assert isinstance(answer, dm.DriverInstalled), answer


async def test_a_node_without_an_anchor_installs_nothing(
    bus: InMemoryBus, host: HostRoot, mirror: Path
) -> None:
    async with running_agent(bus, host, mirror, DriverManagerConfig()) as bare:
        answer = await bare.send(install(source_of(mirror)))
    print(f"\nInstallDriver on a node whose config lists no trust -> {outcome(answer)}")
    assert isinstance(answer, dm.DriverInstallFailed), answer
    assert "(allowed: none)" in answer.message
