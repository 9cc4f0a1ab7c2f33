"""How a driver's source is trusted: the policy's `publicKeys`, `allowUnsigned`, `caBundle`
and `sha256` are checked when the policy is read and travel, with the source they belong
to, into the `InstallDriver` command the node's driver-manager verifies the index with."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.events import driver as dm
from gpuop.policy import PolicyInvalid, validate_spec
from gpuop.saga.upgrade import records
from tests.support.sagas import Run, S

KEY = "RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3"
ROTATED = "RWRncHVvcHNpbaa1S2oFZ4CCorTHnOuV+lm9evR4we1vli3tmrch6Asz"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
DIGEST = "ab" * 32


def spec_with(**gpu: Any) -> dict[str, Any]:
    return {
        "driver": {"gpu": {"version": "580.200.01", "source": "https://mirror.example/", **gpu}}
    }


def refusal(**gpu: Any) -> str:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(spec_with(**gpu))
    return refused.value.message


def test_trust_fields_read_in_camel_case_and_unset_means_signed_only() -> None:
    plain = validate_spec(spec_with()).driver.gpu
    assert (plain.public_keys, plain.allow_unsigned, plain.ca_bundle, plain.sha256) == (
        None,
        None,
        None,
        None,
    )
    target = records.desired_targets(validate_spec(spec_with()))[dm.Component.GPU]
    assert (target.public_keys, target.allow_unsigned) == ((), False)
    gpu = validate_spec(
        spec_with(publicKeys=[KEY, ROTATED], allowUnsigned=True, caBundle=PEM, sha256=DIGEST)
    ).driver.gpu
    assert gpu.public_keys == (KEY, ROTATED) and gpu.allow_unsigned
    assert (gpu.ca_bundle, gpu.sha256) == (PEM, DIGEST)
    assert validate_spec(spec_with(caBundle="/etc/gpuop/ca.pem")).driver.gpu.ca_bundle


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"publicKeys": ["RWQf6LRCGA9i53ml"]}, "must be a minisign public key"),
        ({"publicKeys": ["untrusted comment: minisign public key E7620F1842B4E81F"]}, "minisign"),
        ({"publicKeys": [KEY] * 9}, "at most 8"),
        ({"caBundle": "ca.pem"}, "PEM certificates"),
        ({"sha256": "AB" * 32}, "sha256"),
    ],
)
def test_malformed_trust_is_refused_when_the_policy_is_read(
    fields: dict[str, Any], said: str
) -> None:
    assert said in refusal(**fields)


def test_the_install_command_carries_the_sources_trust() -> None:
    spec = validate_spec(
        spec_with(publicKeys=[KEY], allowUnsigned=True, caBundle=PEM, sha256=DIGEST)
    )
    target = records.desired_targets(spec)[dm.Component.GPU]
    assert (target.public_keys, target.allow_unsigned, target.ca_bundle) == ((KEY,), True, PEM)
    run = Run(spec)
    run.admit()
    run.until(S.UPGRADE_DONE)
    install = next(c.payload for c in run.commands() if c.step == "install-gpu")
    assert isinstance(install, dm.InstallDriver)
    assert install.source == dm.DriverSource(
        uri="https://mirror.example/",
        sha256=DIGEST,
        public_keys=(KEY,),
        allow_unsigned=True,
        ca_bundle=PEM,
    )


def test_a_pool_trusts_its_own_sources_keys() -> None:
    spec = validate_spec(
        {
            "driver": {
                "gpu": {"version": "580.200.01", "source": "/srv/drivers", "publicKeys": [KEY]},
                "pools": [
                    {
                        "name": "h200",
                        "nodeSelector": "gpu=h200",
                        "gpu": {
                            "version": "580.200.01",
                            "source": "https://h200.example/",
                            "publicKeys": [ROTATED],
                        },
                    }
                ],
            }
        }
    )
    assert records.desired_targets(spec)[dm.Component.GPU].public_keys == (KEY,)
    assert records.desired_targets(spec, "h200")[dm.Component.GPU].public_keys == (ROTATED,)


def test_a_saga_stored_before_trust_existed_reads_as_trusting_no_key() -> None:
    target = records.Target.model_validate({"version": "580.200.01", "source": "/srv/drivers"})
    assert (target.public_keys, target.allow_unsigned, target.ca_bundle) == ((), False, None)
