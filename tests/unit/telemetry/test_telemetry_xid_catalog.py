"""gpuop's XID catalog: the shipped file loads, covers the XIDs the reference names with the
actions gpuop documents, gives an unlisted XID the default, and a malformed catalog fails its
load with an error naming the entry."""

from __future__ import annotations

import json
from datetime import date
from importlib import resources
from typing import Any

import pytest

from gpuop.events.device import XidAction
from gpuop.health import APPLICATION_XIDS, xids

COMMON_XIDS = (13, 31, 32, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119)
COMMON_XIDS += (120, 121, 140, 143, 154, *range(144, 151), 46)


def _shipped() -> dict[str, Any]:
    text = resources.files("gpuop.health").joinpath(xids.CATALOG_FILE).read_text("utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def _parse(document: dict[str, Any]) -> xids.XidCatalog:
    return xids.parse(json.dumps(document), origin="test.json")


def test_the_shipped_catalog_is_versioned_dated_and_sourced() -> None:
    catalog = xids.packaged()

    assert catalog.version >= 1
    assert catalog.date >= date(2026, 8, 1)
    assert any("docs.nvidia.com/deploy/xid-errors" in source for source in catalog.sources)
    assert set(COMMON_XIDS) <= set(catalog.entries)


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (13, XidAction.RESTART_APPLICATION),
        (31, XidAction.RESTART_APPLICATION),
        (43, XidAction.NONE),
        (45, XidAction.NONE),
        (92, XidAction.NONE),
        (94, XidAction.RESTART_APPLICATION),
        (48, XidAction.RESET_GPU),  # uncorrectable ECC
        (95, XidAction.RESET_GPU),
        (140, XidAction.RESET_GPU),
        (63, XidAction.RESET_GPU),  # row remap pending: the catalog ignores it, gpuop resets
        (64, XidAction.RESET_GPU),
        (74, XidAction.RESET_GPU),
        (79, XidAction.REBOOT),  # off the bus: no reset reaches it
        (154, XidAction.RESET_GPU),
    ],
)
def test_each_xid_has_the_documented_action(xid: int, action: XidAction) -> None:
    assert xids.packaged().action(xid) is action


def test_the_device_plugins_application_xids_keep_the_gpu_healthy_but_109() -> None:
    catalog = xids.packaged()

    healthy = {xid for xid in APPLICATION_XIDS if catalog.action(xid).keeps_gpu_healthy}

    assert healthy == set(APPLICATION_XIDS) - {109}


def test_an_xid_the_catalog_does_not_list_gets_the_documented_default() -> None:
    catalog = xids.packaged()

    assert 4242 not in catalog.entries
    assert catalog.action(4242) is XidAction.RESET_GPU is catalog.default
    assert catalog.describe(4242) == "XID 4242 (not in the catalog)"
    assert "device plugin" in _shipped()["default"]["why"]


def test_an_entry_of_its_own_action_says_why() -> None:
    document = _shipped()
    buckets = document["buckets"]

    differing = [e for e in document["xids"] if "action" in e]

    assert differing, "63 at least differs from its bucket"
    for entry in differing:
        assert entry["action"] != buckets.get(entry["bucket"]), entry["xid"]
        assert entry.get("note"), f"XID {entry['xid']} differs from its bucket without a note"


def test_actions_are_in_escalation_order() -> None:
    assert [action.value for action in sorted(XidAction, key=lambda a: a.rank)] == [
        "none",
        "restart-application",
        "mark",
        "reset-gpu",
        "reboot",
        "drain-and-replace",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["xids"][2].update(bucket="NO_SUCH_BUCKET"),
            "xids[2] (XID 32): bucket 'NO_SUCH",
        ),
        (lambda d: d["xids"][3].update(action="reformat"), "xids[3] (XID 38): action: Input"),
        (lambda d: d["xids"][1].update(xid=13), "xids[1] (XID 13): XID 13 listed twice"),
        (lambda d: d["xids"][0].update(xid=70000), "xids[0] (XID 70000): xid: Input"),
        (lambda d: d["xids"][4].pop("name"), "xids[4] (XID 43): name: Field required"),
        (lambda d: d["xids"][5].update(xid="45"), "xids[5] (XID 45): xid: Input should be"),
        (lambda d: d["xids"][6].update(colour="red"), "xids[6] (XID 46): colour: Extra"),
        (lambda d: d["xids"].insert(0, 48), "xids[0]: Input should be"),
        (lambda d: d["buckets"].update(IGNORE="shrug"), "buckets.IGNORE"),
        (lambda d: d["default"].update(action="panic"), "default.action"),
        (lambda d: d.update(date="last week"), "date: Input"),
        (lambda d: d.update(sources=[]), "sources: "),
        (lambda d: d.update(format=2), "format 2 is not the one this gpuop reads"),
    ],
)
def test_a_malformed_catalog_fails_naming_the_entry(change: Any, expected: str) -> None:
    document = _shipped()
    change(document)

    with pytest.raises(xids.CatalogError) as raised:
        _parse(document)

    assert str(raised.value).startswith("test.json: ")
    assert expected in str(raised.value)


def test_a_catalog_that_is_not_json_fails_saying_so() -> None:
    with pytest.raises(xids.CatalogError, match=r"^bad\.json: not JSON"):
        xids.parse("{ xids: [", origin="bad.json")
    with pytest.raises(xids.CatalogError, match=r"^bad\.json: not a JSON object but list"):
        xids.parse("[]", origin="bad.json")
