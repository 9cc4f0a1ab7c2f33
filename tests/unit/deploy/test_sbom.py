"""`make sbom` (issue 17, finding 7): a CycloneDX SBOM of what the image installs, built by
the Makefile's own target into a path of the test's, valid against the CycloneDX schema, and
naming gpuop, nats-py and every package of the runtime lock at its locked version with the
lock's hashes, and every Debian package of the image (deploy/image/debian.lock, what
`make image` unpacks) by its package URL with its .deb's SHA-256."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from tests.support.charts import REPO
from tests.support.images import debian
from tests.support.locks import RUNTIME, pins

VENV = Path(sys.prefix)


@pytest.fixture(scope="module")
def sbom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    make = shutil.which("make")
    assert make, "make is needed: install it (apt-get install make)"
    output = tmp_path_factory.mktemp("sbom") / "out" / "sbom.cdx.json"
    # this venv is set up already (-o: do not remake the install stamp)
    subprocess.run(
        [make, "--no-print-directory", "-o", str(VENV / ".installed"), "sbom",
         f"VENV={VENV}", f"SBOM={output}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=100,
    )  # fmt: skip
    text = output.read_text(encoding="utf-8")
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    document: dict[str, Any] = json.loads(text)
    return document


def components(document: dict[str, Any], kind: str = "pypi") -> dict[str, dict[str, Any]]:
    """The components whose package URLs are of `kind` (pypi, deb), by name."""
    return {
        component["name"].lower(): component
        for component in document["components"]
        if component["purl"].startswith(f"pkg:{kind}/")
    }


@pytest.mark.timeout(120)
def test_the_sbom_is_cyclonedx_1_6_describing_gpuop(sbom: dict[str, Any]) -> None:
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.6")
    root = sbom["metadata"]["component"]
    assert (root["name"], root["type"]) == ("gpuop", "application")


@pytest.mark.timeout(120)
def test_the_sbom_names_every_locked_runtime_package_at_its_version_and_hashes(
    sbom: dict[str, Any],
) -> None:
    found = components(sbom)
    locked = pins(RUNTIME)
    assert "nats-py" in found
    assert sorted(set(locked) - set(found)) == []
    assert sorted(set(found) - set(locked)) == [], "only what the image installs"
    for name, (version, _, hashes) in locked.items():
        component = found[name]
        assert component["version"] == version, name
        assert component["purl"] == f"pkg:pypi/{name}@{version}", name
        listed = [h for ref in component.get("externalReferences", []) for h in ref["hashes"]]
        assert len(listed) == hashes and {h["alg"] for h in listed} == {"SHA-256"}, name


@pytest.mark.timeout(120)
def test_the_sbom_names_every_debian_package_of_the_image(sbom: dict[str, Any]) -> None:
    found = components(sbom, "deb")
    locked = {pin.name: pin for pin in debian.read_lock()}

    assert {"python3.11-minimal", "libpython3.11-stdlib", "libc6", "ca-certificates"} <= set(found)
    assert sorted(found) == sorted(locked), "exactly the image's packages"
    assert len(found) + len(components(sbom)) == len(sbom["components"]), "nothing else"
    for name, pin in locked.items():
        component = found[name]
        assert component["version"] == pin.version, name
        purl = PackageURL.from_string(component["purl"])
        assert (purl.type, purl.namespace, purl.name) == ("deb", "debian", name)
        assert (purl.version, purl.qualifiers) == (pin.version, {"arch": pin.architecture})
        assert component["hashes"] == [{"alg": "SHA-256", "content": pin.sha256}], name
    (root,) = [entry for entry in sbom["dependencies"] if entry["ref"] == "root-component"]
    assert {component["bom-ref"] for component in found.values()} <= set(root["dependsOn"])


def test_the_validator_refuses_a_document_that_breaks_the_schema() -> None:
    """The check above can fail: a component of no CycloneDX type is an error."""
    broken = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "components": [{"type": "nonsense", "name": "nats-py"}],
    }
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(broken))
    assert error is not None and "'nonsense' is not one of" in str(error)
