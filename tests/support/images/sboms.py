"""The image's SBOM (`make sbom`): cyclonedx-py's document of requirements/runtime.lock and
gpuop, completed here with the image's Debian packages from deploy/image/debian.lock (the
exact .debs `make image` unpacks), each a CycloneDX library with its package URL
(`pkg:deb/debian/<name>@<version>?arch=<arch>`) and its .deb's SHA-256, and validated
against the CycloneDX 1.6 schema before it is written.

    add_debian(path)     complete the SBOM at `path` in place
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from tests.support.images import debian


class SbomError(Exception):
    """The completed document breaks the CycloneDX schema."""


def debian_component(pin: debian.Pin) -> dict[str, Any]:
    return {
        "type": "library",
        "bom-ref": pin.purl,
        "name": pin.name,
        "version": pin.version,
        "purl": pin.purl,
        "hashes": [{"alg": "SHA-256", "content": pin.sha256}],
    }


def add_debian(path: Path, pins: tuple[debian.Pin, ...] | None = None) -> None:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    components = [debian_component(pin) for pin in pins or debian.read_lock()]
    document["components"] = document.get("components", []) + components
    references = [component["bom-ref"] for component in components]
    dependencies = document.setdefault("dependencies", [])
    dependencies.extend({"ref": reference} for reference in references)
    root = document["metadata"]["component"]["bom-ref"]
    for entry in dependencies:
        if entry["ref"] == root:
            entry["dependsOn"] = sorted({*entry.get("dependsOn", []), *references})
            break
    else:
        dependencies.append({"ref": root, "dependsOn": sorted(references)})
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise SbomError(f"{path}: not CycloneDX 1.6: {error}")
    path.write_text(text, encoding="utf-8")
