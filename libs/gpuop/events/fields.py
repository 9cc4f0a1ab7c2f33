"""Constrained field types and small records that several catalogue modules share.

Every string and number that arrives from the bus is bounded here, so a hostile or broken
producer cannot make a consumer hold a megabyte-long "version". The catalogue modules
(`hardware`, `driver`, `device`, `network`, `upgrade`, `kube`, `deadlines`) build their
payloads from these types; nothing outside `gpuop.events` needs to import this module
except to name a type.

`DocumentedEnum` is the base of every enum on the wire: each member carries an attribute
docstring, and the generated JSON Schemas list those docstrings in the enum's description.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from enum import StrEnum
from functools import cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, StringConstraints
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN_PART = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"

NodeName = Annotated[
    str,
    StringConstraints(max_length=253, pattern=rf"^{_SUBDOMAIN_PART}(\.{_SUBDOMAIN_PART})*$"),
]
"""A Kubernetes node name: an RFC 1123 subdomain, checked the way Kubernetes checks it."""
ObjectName = NodeName
"""A Kubernetes object name such as a pod or a PodDisruptionBudget (RFC 1123 subdomain)."""
Namespace = Annotated[str, StringConstraints(max_length=63, pattern=rf"^{_DNS_LABEL}$")]
"""A Kubernetes namespace (RFC 1123 label)."""
LabelKey = Annotated[
    str,
    StringConstraints(
        max_length=317,
        pattern=r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
    ),
]
"""A Kubernetes label key: optional DNS prefix and `/`, then a name of at most 63 characters."""
LabelValue = Annotated[
    str, StringConstraints(max_length=63, pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
]
"""A Kubernetes label value (may be empty)."""

MESSAGE_MAX_LENGTH = 2048
Message = Annotated[str, StringConstraints(max_length=MESSAGE_MAX_LENGTH)]
"""Human-readable detail for logs and operators; never parsed by code."""
Version = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z][0-9A-Za-z.+_~-]*$")
]
"""A driver or software version: `580.159.04`, `24.10-1.1.4.0`, `13.0`."""
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest as 64 lowercase hex digits."""
BootId = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"),
]
"""The kernel's boot id, `/proc/sys/kernel/random/boot_id`: a new one every boot."""
MessageId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
"""The envelope id of a message, such as the command a result answers."""
CorrelationId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/-]{1,256}$")]
"""A saga or rollout id, as carried in the envelope's `correlationid`."""
PoolName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")]
"""A driver pool's name (`driver.pools[].name`): a DNS label of at most 32 characters."""
Token = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
"""A short lowercase name: a saga step, a network mode."""
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A kernel module name as `/proc/modules` lists it: `nvidia_uvm`."""
KernelRelease = Annotated[str, StringConstraints(min_length=1, max_length=128)]
"""A kernel release as `uname -r` prints it: `6.1.0-44-amd64`."""
GpuUuid = Annotated[
    str,
    StringConstraints(
        pattern=r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    ),
]
"""A GPU's UUID as NVML reports it: `GPU-20bce083-dbf9-2d4f-3c35-c858915accc5`."""

Count = Annotated[int, Field(ge=0, le=1_000_000)]
"""A non-negative count of nodes, pods, devices or retries."""
Bytes = Annotated[int, Field(ge=0, le=2**53)]
"""A size in bytes (bounded to what a JSON number holds exactly)."""
Seconds = Annotated[float, Field(ge=0, le=10 * 365 * 86400)]
"""A duration in seconds."""
TimeoutSeconds = Annotated[int, Field(ge=1, le=7 * 86400)]
"""How long an agent may take for a step; every wait has one, there is no "forever"."""
Attempt = Annotated[int, Field(ge=1, le=10_000)]
"""Which try of a step this is: 1 on the first try, incremented on each retry."""


WIRE_MODEL = ConfigDict(
    extra="ignore", frozen=True, use_attribute_docstrings=True, defer_build=True
)
"""How a model on the wire reads: tolerant of unknown fields (a newer producer's), frozen,
its attribute docstrings the schema's descriptions."""


class Record(BaseModel):
    """Base of the nested records inside payloads: frozen, tolerant of unknown fields."""

    model_config = WIRE_MODEL


class NamespacedName(Record):
    """A namespaced Kubernetes object such as a pod or a PodDisruptionBudget."""

    namespace: Namespace
    """Namespace of the object."""
    name: ObjectName
    """Name of the object."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class DocumentedEnum(StrEnum):
    """A string enum whose members each carry an attribute docstring.

    The docstrings are read from the source (Python keeps no per-member docstring), listed
    by `member_docs`, and appended to the enum's description in the generated JSON Schema.
    """

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler.resolve_ref_schema(handler(core_schema))
        docs = member_docs(cls)
        lines = [f"- `{m.value}`: {docs[m.name]}" for m in cls if m.name in docs]
        if lines:
            schema["description"] = "\n".join([schema.get("description", ""), "", *lines]).strip()
        return schema


@cache
def member_docs(enum: type[StrEnum]) -> dict[str, str]:
    """Member name -> the docstring written under that member in `enum`'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(enum)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            continue
        docs[statement.targets[0].id] = inspect.cleandoc(following.value.value)
    return {name: doc for name, doc in docs.items() if name in enum.__members__}
