"""Schema generation: complete, deterministic, valid AsyncAPI 3 shape, tidy on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuop.events import REGISTRY, Command, Event, schemas


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return schemas.render()


@pytest.fixture(scope="module")
def document(files: dict[str, str]) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(files[schemas.ASYNCAPI_FILE])
    return loaded


def test_rendering_is_deterministic_and_ends_with_a_newline(files: dict[str, str]) -> None:
    assert schemas.render() == files
    assert all(content.endswith("\n") for content in files.values())
    assert list(files) == sorted(files)


def test_one_json_schema_per_registered_type_plus_the_envelope(files: dict[str, str]) -> None:
    expected = {f"{type_}.schema.json" for type_ in REGISTRY} | {"envelope.schema.json"}
    assert {name for name in files if name.endswith(".schema.json")} == expected
    loaded = json.loads(files["io.gpuop.driver.loaded.v1.schema.json"])
    assert loaded["x-gpuop-type"] == "io.gpuop.driver.loaded.v1"
    assert loaded["x-gpuop-subject"] == "gpuop.evt.driver.{node}.loaded"
    assert loaded["properties"]["version"]["description"] == "Loaded version."
    assert loaded["$schema"] == schemas.JSON_SCHEMA_DIALECT


def test_the_asyncapi_document_describes_every_type(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.0.0"
    messages = document["components"]["messages"]
    assert {message["name"] for message in messages.values()} == set(REGISTRY)
    for cls in REGISTRY.values():
        message = messages[cls.__name__]
        assert message["payload"]["allOf"][0] == {"$ref": "#/components/schemas/Envelope"}
        data_ref = message["payload"]["allOf"][1]["properties"]["data"]["$ref"]
        assert data_ref.removeprefix("#/components/schemas/") in document["components"]["schemas"]
    operations = document["operations"].values()
    assert {op["action"] for op in operations} == {"send", "receive"}
    for operation in operations:
        channel_id = operation["channel"]["$ref"].removeprefix("#/channels/")
        assert channel_id in document["channels"]
        for ref in operation["messages"]:
            assert ref["$ref"].startswith(f"#/channels/{channel_id}/messages/")


def test_every_reference_resolves(document: dict[str, Any]) -> None:
    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
            return found + [r for value in node.values() for r in refs(value)]
        if isinstance(node, list):
            return [r for value in node for r in refs(value)]
        return []

    for ref in refs(document):
        target: Any = document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        assert isinstance(target, dict), ref


def test_channels_are_parameterised_like_the_subjects(document: dict[str, Any]) -> None:
    channels = document["channels"]
    state = channels["evt-upgrade-state-changed"]
    assert state["address"] == "gpuop.evt.upgrade.{node}.{state}"
    assert set(state["parameters"]) == {"node", "state"}
    assert "upgrade-failed" in state["parameters"]["state"]["enum"]
    assert channels["evt-upgrade-rollout-started"]["address"] == (
        "gpuop.evt.upgrade._cluster.rollout-started"
    )
    assert "parameters" not in channels["evt-upgrade-rollout-started"]
    assert channels["cmd-driver-manager-unload"]["address"] == (
        "gpuop.cmd.driver-manager.{node}.unload"
    )
    for cls in REGISTRY.values():
        address = schemas.channel_address(cls)
        assert address.startswith("gpuop.cmd." if issubclass(cls, Command) else "gpuop.evt.")
        assert issubclass(cls, Command | Event)


def test_enum_member_docs_reach_the_schemas(document: dict[str, Any]) -> None:
    description = document["components"]["schemas"]["UpgradeState"]["description"]
    assert "- `reboot-required`: " in description


def test_writing_removes_stale_schemas_and_keeps_unrelated_files(tmp_path: Path) -> None:
    (tmp_path / "io.gpuop.driver.gone.v1.schema.json").write_text("{}\n")
    (tmp_path / "README.md").write_text("keep me\n")
    written = schemas.render(tmp_path)
    on_disk = {path.name for path in tmp_path.iterdir()}
    assert on_disk == set(written) | {"README.md"}
    assert all((tmp_path / name).read_text() == content for name, content in written.items())


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert schemas.main([str(tmp_path)]) == 0
    assert schemas.main([str(tmp_path), "--check"]) == 0
    (tmp_path / "envelope.schema.json").write_text("{}\n")
    (tmp_path / "io.gpuop.driver.gone.v1.schema.json").write_text("{}\n")
    assert schemas.main([str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "envelope.schema.json" in err
    assert "io.gpuop.driver.gone.v1.schema.json" in err
    assert "make schemas" in err
