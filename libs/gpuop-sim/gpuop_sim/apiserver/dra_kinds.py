"""Dynamic Resource Allocation's published side: slices, classes, taint rules, claim templates.

The ``resource.k8s.io/v1`` kinds beside ``kinds.RESOURCECLAIMS`` that a DRA driver writes or
reads: ResourceSlices (a driver's devices, per pool), DeviceClasses (what a request names),
DeviceTaintRules (taints on devices, set by admins or sagas) and ResourceClaimTemplates (what
a pod's claims are made from). ``kinds.BUILTIN`` serves them. Each is stored as sent; the
validators check the fields gpuop and the real scheduler rely on, with the API server's rules
(a slice's placement is exactly one of four, at most 128 devices, attribute values of exactly
one type, the driver, pool and node immutable), so the simulated server refuses what a real
one would refuse. Nothing here allocates: the real scheduler does that in the real-cluster
tests; the fast suites write claims' allocations themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpuop_sim.apiserver import validation
from gpuop_sim.apiserver.errors import FieldError
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]

MAX_DEVICES = 128
"""Devices in one slice (``ResourceSliceMaxDevices``)."""
MAX_ATTRIBUTES_AND_CAPACITIES = 32
"""Attributes plus capacities of one device, together."""
MAX_STRING_LENGTH = 64
"""A string or version attribute value's longest length."""
DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")

_PLACEMENTS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def _present(
    path: str, value: str, check: Callable[[str, str], list[FieldError]]
) -> list[FieldError]:
    """`check`'s errors for a value given, `Required` for an empty one."""
    return check(path, value) if value else [FieldError.required(path, "")]


def _immutable(path: str, new: Any, old: Any) -> list[FieldError]:
    return [] if new == old else [FieldError.invalid(path, new, "field is immutable")]


def qualified_attribute_errors(path: str, name: str) -> list[FieldError]:
    """A device attribute or capacity name: a C identifier of at most 32 characters,
    optionally after a DNS-subdomain domain and ``/``."""
    domain, slash, identifier = name.rpartition("/")
    found: list[FieldError] = []
    if slash:
        found += validation.subdomain_errors(path, domain)
    if len(identifier) > 32:
        found.append(FieldError.invalid(path, name, "must be no more than 32 characters"))
    if not _C_IDENTIFIER.fullmatch(identifier):
        found.append(
            FieldError.invalid(
                path,
                name,
                "a valid C identifier must start with alphabetic character or '_', followed by "
                "a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
                "'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')",
            )
        )
    return found


def _attribute_errors(path: str, value: Any) -> list[FieldError]:
    if not isinstance(value, dict):
        return [FieldError.invalid(path, value, "must be an object")]
    present = [kind for kind in _ATTRIBUTE_TYPES if kind in value]
    if len(present) != 1:
        return [
            FieldError.invalid(path, value, "exactly one value must be specified")
            if present
            else FieldError.required(path, "exactly one value must be specified")
        ]
    kind = present[0]
    item = value[kind]
    found: list[FieldError] = []
    if kind in ("string", "version") and len(str(item)) > MAX_STRING_LENGTH:
        found.append(
            FieldError.invalid(
                f"{path}.{kind}", item, f"must be no more than {MAX_STRING_LENGTH} bytes"
            )
        )
    if kind == "version" and not _SEMVER.fullmatch(str(item)):
        found.append(
            FieldError.invalid(
                f"{path}.version", item, "must be a string compatible with semver.org spec 2.0.0"
            )
        )
    if kind == "int" and (isinstance(item, bool) or not isinstance(item, int)):
        found.append(FieldError.invalid(f"{path}.int", item, "must be an integer"))
    if kind == "bool" and not isinstance(item, bool):
        found.append(FieldError.invalid(f"{path}.bool", item, "must be a boolean"))
    return found


def _device_errors(path: str, device: Obj) -> list[FieldError]:
    found = _present(f"{path}.name", device.get("name") or "", validation.dns_label_errors)
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    for key, value in attributes.items():
        found += qualified_attribute_errors(f"{path}.attributes[{key}]", key)
        found += _attribute_errors(f"{path}.attributes[{key}]", value)
    for key, value in capacity.items():
        found += qualified_attribute_errors(f"{path}.capacity[{key}]", key)
        if not isinstance(value, dict) or "value" not in value:
            found.append(FieldError.required(f"{path}.capacity[{key}].value", ""))
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        found.append(
            FieldError.invalid(
                path,
                total,
                f"the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for index, taint in enumerate(device.get("taints") or []):
        found += _device_taint_errors(f"{path}.taints[{index}]", taint)
    return found


def _resourceslice_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found: list[FieldError] = []
    driver = spec.get("driver") or ""
    if not driver:
        found.append(FieldError.required("spec.driver", ""))
    else:
        found += validation.subdomain_errors("spec.driver", driver)
        if len(driver) > 63:
            found.append(
                FieldError.invalid("spec.driver", driver, "must be no more than 63 characters")
            )
    pool = spec.get("pool") or {}
    pool_name = pool.get("name") or ""
    if not pool_name:
        found.append(FieldError.required("spec.pool.name", ""))
    else:
        for part in pool_name.split("/"):
            found += validation.subdomain_errors("spec.pool.name", part)
    if int(pool.get("generation") or 0) < 0:
        found.append(
            FieldError.invalid(
                "spec.pool.generation", pool.get("generation"), "must be greater than or equal to 0"
            )
        )
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        found.append(
            FieldError.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
        )
    placements = [key for key in _PLACEMENTS if spec.get(key)]
    if len(placements) != 1:
        detail = f"exactly one of `{'`, `'.join(_PLACEMENTS)}` is required"
        found.append(
            FieldError.invalid("spec", placements, detail)
            if placements
            else FieldError.required("spec", detail)
        )
    if spec.get("nodeName"):
        found += validation.subdomain_errors("spec.nodeName", spec["nodeName"])
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES:
        found.append(FieldError.too_many("spec.devices", len(devices), MAX_DEVICES))
    seen: set[str] = set()
    for index, device in enumerate(devices):
        found += _device_errors(f"spec.devices[{index}]", device)
        name = device.get("name")
        if name in seen:
            found.append(FieldError.duplicate(f"spec.devices[{index}].name", name))
        seen.add(name)
    if old is not None:
        old_spec = old.get("spec") or {}
        found += _immutable("spec.driver", spec.get("driver"), old_spec.get("driver"))
        found += _immutable(
            "spec.pool.name", pool.get("name"), (old_spec.get("pool") or {}).get("name")
        )
        found += _immutable("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName"))
    return found


def _device_taint_errors(path: str, taint: Any) -> list[FieldError]:
    if not isinstance(taint, dict):
        return [FieldError.required(path, "")]
    found = _present(f"{path}.key", taint.get("key") or "", validation.qualified_name_errors)
    effect = taint.get("effect") or ""
    if not effect:
        found.append(FieldError.required(f"{path}.effect", ""))
    elif effect not in DEVICE_TAINT_EFFECTS:
        found.append(FieldError.not_supported(f"{path}.effect", effect, DEVICE_TAINT_EFFECTS))
    return found


def _devicetaintrule_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found = _device_taint_errors("spec.taint", spec.get("taint"))
    selector = spec.get("deviceSelector")
    if isinstance(selector, dict):
        if selector.get("driver"):
            found += validation.subdomain_errors("spec.deviceSelector.driver", selector["driver"])
        if selector.get("device"):
            found += validation.dns_label_errors("spec.deviceSelector.device", selector["device"])
    return found


def _deviceclass_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    found: list[FieldError] = []
    for index, selector in enumerate(spec.get("selectors") or []):
        expression = ((selector or {}).get("cel") or {}).get("expression") or ""
        if not expression.strip():
            found.append(FieldError.required(f"spec.selectors[{index}].cel.expression", ""))
    for index, config in enumerate(spec.get("config") or []):
        opaque = (config or {}).get("opaque") or {}
        if not opaque.get("driver"):
            found.append(FieldError.required(f"spec.config[{index}].opaque.driver", ""))
    name = spec.get("extendedResourceName")
    if name is not None:
        found += validation.qualified_name_errors("spec.extendedResourceName", name)
        if "/" not in name:
            found.append(
                FieldError.invalid(
                    "spec.extendedResourceName", name, "must be a fully-qualified resource name"
                )
            )
    return found


def _claim_requests_errors(path: str, devices: Obj) -> list[FieldError]:
    found: list[FieldError] = []
    for index, request in enumerate(devices.get("requests") or []):
        item = f"{path}.requests[{index}]"
        name = (request or {}).get("name") or ""
        found += _present(f"{item}.name", name, validation.dns_label_errors)
        exactly = (request or {}).get("exactly")
        if exactly is not None and not exactly.get("deviceClassName"):
            found.append(FieldError.required(f"{item}.exactly.deviceClassName", ""))
    return found


def _resourceclaimtemplate_validate(new: Obj, old: Obj | None) -> list[FieldError]:
    spec = new.get("spec") or {}
    devices = (spec.get("spec") or {}).get("devices") or {}
    found = _claim_requests_errors("spec.spec.devices", devices)
    if old is not None:
        found += _immutable("spec", spec, old.get("spec") or {})
    return found


RESOURCESLICES = ResourceType(
    "resource.k8s.io",
    "v1",
    "ResourceSlice",
    "resourceslices",
    "resourceslice",
    namespaced=False,
    description=(
        "ResourceSlice represents one or more resources in a pool of similar resources, managed "
        "by a common driver."
    ),
    validate=_resourceslice_validate,
    field_labels=("spec.nodeName", "spec.driver", "spec.pool.name"),
)
"""A driver's devices, one pool's part; the kubelet deletes a node's by ``spec.nodeName``."""
DEVICECLASSES = ResourceType(
    "resource.k8s.io",
    "v1",
    "DeviceClass",
    "deviceclasses",
    "deviceclass",
    namespaced=False,
    description=(
        "DeviceClass is a vendor- or admin-provided resource that contains device configuration "
        "and selectors."
    ),
    validate=_deviceclass_validate,
)
DEVICETAINTRULES = ResourceType(
    "resource.k8s.io",
    "v1",
    "DeviceTaintRule",
    "devicetaintrules",
    "devicetaintrule",
    namespaced=False,
    description="DeviceTaintRule adds one taint to all devices which match the selector.",
    subresources=frozenset({"status"}),
    validate=_devicetaintrule_validate,
)
RESOURCECLAIMTEMPLATES = ResourceType(
    "resource.k8s.io",
    "v1",
    "ResourceClaimTemplate",
    "resourceclaimtemplates",
    "resourceclaimtemplate",
    namespaced=True,
    description=(
        "ResourceClaimTemplate is used to produce ResourceClaim objects. The spec is immutable."
    ),
    validate=_resourceclaimtemplate_validate,
)

DRA_KINDS = (RESOURCESLICES, DEVICECLASSES, DEVICETAINTRULES, RESOURCECLAIMTEMPLATES)
"""The types served beside ResourceClaims, in the order discovery lists them."""
