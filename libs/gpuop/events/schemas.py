"""Generates the published wire contracts from the models: AsyncAPI 3 and JSON Schemas.

`make schemas` runs `python -m gpuop.events.schemas proto/events`, which writes
`asyncapi.yaml` (every channel, operation and message, each message the envelope around its
payload), `envelope.schema.json`, and one `<type>.schema.json` per registered payload type,
with descriptions taken from the models' docstrings. It removes schema files of types that no
longer exist. The output is deterministic, so `tests/unit/test_schema_drift.py` compares
`render()` with the committed files byte for byte; external tools read the committed files.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import gpuop
from gpuop.events import REGISTRY, Command, Envelope, Event, Payload, subjects

ASYNCAPI_FILE = "asyncapi.yaml"
ENVELOPE_FILE = "envelope.schema.json"
SCHEMA_SUFFIX = ".schema.json"
ASYNCAPI_VERSION = "3.0.0"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_COMPONENT_REF = "#/components/schemas/{model}"

_DESCRIPTION = """\
Events and commands of gpuop, the GPU and RDMA-network node operator, on NATS JetStream.

Every message is one JSON document: a CloudEvents 1.0 envelope (`specversion`, `id`, `source`,
`type`, `subject`, `time`) plus the extensions `correlationid` (the saga or rollout),
`causationid` (the message that caused this one) and `traceparent`, with the payload in
`data`. The `Nats-Msg-Id` header is made from the envelope `id` (an HMAC of subject and id
under the publisher's credential where NATS has users, the id itself where it has none), so
a retried publish is dropped by the server and no other publisher can take its id first.
Readers must ignore fields they do not know; a breaking change is published as a new `type`
version.

Events (facts, past tense) travel on `gpuop.evt.<domain>.<node>.<name>`, commands (orders to
one node agent) on `gpuop.cmd.<service>.<node>.<verb>`, messages that could not be processed
on `gpuop.dlq.<original subject>`. The `gpuop` prefix is configurable per installation. The
node token is the Kubernetes node name with `.` written as `_`; cluster-wide events use
`_cluster`. Upgrade progress is public: subscribe to `gpuop.evt.upgrade.>`.

Operations are described from gpuop's side: it sends the events and receives the commands
(the upgrade orchestrator sends them to the node agents).
"""

_NODE_PARAMETER = {
    "description": "Kubernetes node name with `.` written as `_` (or `_cluster`).",
    "examples": ["gpu-node-1", "gpu-1_example_com", subjects.CLUSTER],
}


def payload_types() -> list[type[Payload]]:
    """Every registered payload model, in a stable order (by CloudEvents type)."""
    return [REGISTRY[type_] for type_ in sorted(REGISTRY)]


def schema_filename(type_: str) -> str:
    """File name of the JSON Schema of payload type `type_`."""
    return f"{type_}{SCHEMA_SUFFIX}"


def channel_address(cls: type[Payload]) -> str:
    """AsyncAPI address of the subject `cls` is published on, with `{node}`-style parameters."""
    prefix = subjects.DEFAULT_PREFIX
    if issubclass(cls, Command):
        return f"{prefix}.{subjects.Kind.COMMAND}.{cls.SERVICE}.{{node}}.{cls.VERB}"
    assert issubclass(cls, Event)
    node = subjects.CLUSTER if getattr(cls, "CLUSTER_WIDE", False) else "{node}"
    parameter = getattr(cls, "SUBJECT_PARAMETER", None)
    last = f"{{{parameter}}}" if parameter else cls.NAME
    return f"{prefix}.{subjects.Kind.EVENT}.{cls.DOMAIN}.{node}.{last}"


def envelope_schema() -> dict[str, Any]:
    """JSON Schema of the envelope every message wears."""
    schema = Envelope.model_json_schema()
    return {"$schema": JSON_SCHEMA_DIALECT, "$id": ENVELOPE_FILE, **schema}


def payload_schema(cls: type[Payload]) -> dict[str, Any]:
    """JSON Schema of the `data` of one payload type, with its type and subject."""
    schema = cls.model_json_schema()
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": schema_filename(cls.TYPE),
        "x-gpuop-type": cls.TYPE,
        "x-gpuop-subject": channel_address(cls),
        **schema,
    }


def _doc(cls: type[BaseModel]) -> str:
    return inspect.cleandoc(cls.__doc__ or "")


def _channel_id(cls: type[Payload]) -> str:
    if issubclass(cls, Command):
        return f"cmd-{cls.SERVICE}-{cls.VERB}"
    assert issubclass(cls, Event)
    return f"evt-{cls.DOMAIN}-{cls.NAME}"


def _parameters(cls: type[Payload]) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if "{node}" in channel_address(cls):
        parameters["node"] = {"$ref": "#/components/parameters/node"}
    parameter = getattr(cls, "SUBJECT_PARAMETER", None)
    if parameter:
        field_name: str = getattr(cls, "SUBJECT_FIELD", "")
        field = cls.model_fields[field_name]
        enum = field.annotation
        if not (isinstance(enum, type) and issubclass(enum, StrEnum)):
            raise TypeError(f"{cls.__name__}: a subject parameter must be a StrEnum field")
        values = [member.value for member in enum]
        parameters[parameter] = {"description": field.description, "enum": values}
    return parameters


def _message(cls: type[Payload]) -> dict[str, Any]:
    doc = _doc(cls)
    return {
        "name": cls.TYPE,
        "title": cls.__name__,
        "summary": doc.splitlines()[0] if doc else cls.__name__,
        "description": doc,
        "contentType": "application/json",
        "correlationId": {
            "description": "The saga or rollout the message belongs to.",
            "location": "$message.payload#/correlationid",
        },
        "headers": {
            "type": "object",
            "properties": {
                "Nats-Msg-Id": {
                    "type": "string",
                    "description": "Made from the envelope `id` (keyed by the publisher's "
                    "credential); the server drops duplicates.",
                }
            },
        },
        "payload": {
            "allOf": [
                {"$ref": _COMPONENT_REF.format(model="Envelope")},
                {
                    "type": "object",
                    "required": ["type", "data"],
                    "properties": {
                        "type": {"const": cls.TYPE},
                        "data": {"$ref": _COMPONENT_REF.format(model=cls.__name__)},
                    },
                },
            ]
        },
    }


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of every channel, operation, message and schema."""
    types = payload_types()
    names = [cls.__name__ for cls in types]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise TypeError(f"payload class names must be unique for the schemas: {duplicates}")
    _, definitions = models_json_schema(
        [(Envelope, "validation"), *((cls, "validation") for cls in types)],
        ref_template=_COMPONENT_REF,
    )
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for cls in types:
        channel_id = _channel_id(cls)
        message_ref = {"$ref": f"#/components/messages/{cls.__name__}"}
        messages[cls.__name__] = _message(cls)
        channel = channels.setdefault(
            channel_id,
            {
                "address": channel_address(cls),
                "title": cls.__name__,
                "description": _doc(cls).split("\n\n")[0],
                "messages": {},
            },
        )
        channel["messages"][cls.__name__] = message_ref
        parameters = _parameters(cls)
        if parameters:
            channel["parameters"] = parameters
        is_command = issubclass(cls, Command)
        operation = operations.setdefault(
            f"{'receive' if is_command else 'send'}-{channel_id}",
            {
                "action": "receive" if is_command else "send",
                "channel": {"$ref": f"#/channels/{channel_id}"},
                "messages": [],
            },
        )
        operation["messages"].append({"$ref": f"#/channels/{channel_id}/messages/{cls.__name__}"})
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "gpuop events and commands",
            "version": gpuop.__version__,
            "description": _DESCRIPTION,
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "parameters": {"node": _NODE_PARAMETER},
            "schemas": definitions["$defs"],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, and never anchors or aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _yaml(document: dict[str, Any]) -> str:
    return yaml.dump(
        document, Dumper=_Dumper, sort_keys=True, allow_unicode=True, width=100, indent=2
    )


def render(outdir: Path | str | None = None) -> dict[str, str]:
    """Every generated file, name -> content; written to `outdir` when one is given.

    Writing leaves unchanged files untouched and removes `*.schema.json` files that no
    registered type produces any more.
    """
    files = {ASYNCAPI_FILE: _yaml(asyncapi_document()), ENVELOPE_FILE: _json(envelope_schema())}
    for cls in payload_types():
        files[schema_filename(cls.TYPE)] = _json(payload_schema(cls))
    files = dict(sorted(files.items()))
    if outdir is not None:
        _write(Path(outdir), files)
    return files


def _write(outdir: Path, files: dict[str, str]) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in outdir.glob(f"*{SCHEMA_SUFFIX}"):
        if stale.name not in files:
            stale.unlink()
    for name, content in files.items():
        path = outdir / name
        if not path.exists() or path.read_text(encoding="utf-8") != content:
            path.write_text(content, encoding="utf-8")


def drift(outdir: Path | str) -> list[str]:
    """Names of the files in `outdir` that differ from `render()`, are missing or are stale."""
    outdir = Path(outdir)
    files = render()
    present = {path.name for path in outdir.glob(f"*{SCHEMA_SUFFIX}")}
    if (outdir / ASYNCAPI_FILE).exists():
        present.add(ASYNCAPI_FILE)
    differing = [
        name
        for name, content in files.items()
        if name not in present or (outdir / name).read_text(encoding="utf-8") != content
    ]
    return sorted([*differing, *(present - set(files))])


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpuop.events.schemas OUTDIR [--check]`."""
    parser = argparse.ArgumentParser(prog="python -m gpuop.events.schemas", description=__doc__)
    parser.add_argument("outdir", type=Path, help="directory to write, usually proto/events")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if OUTDIR is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = drift(args.outdir)
        for name in stale:
            print(f"out of date: {args.outdir / name}", file=sys.stderr)
        if stale:
            print("run `make schemas` to regenerate", file=sys.stderr)
        return 1 if stale else 0
    files = render(args.outdir)
    print(f"wrote {len(files)} files to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
