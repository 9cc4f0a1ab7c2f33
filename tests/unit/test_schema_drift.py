"""The committed wire contracts in proto/events are exactly what the models generate."""

from __future__ import annotations

from pathlib import Path

from gpuop.events import schemas

PROTO_EVENTS = Path(__file__).resolve().parents[2] / "proto" / "events"
HINT = "the event models changed: run `make schemas` and commit proto/events"


def test_committed_file_set_matches_the_models() -> None:
    committed = {path.name for path in PROTO_EVENTS.iterdir() if path.is_file()}
    rendered = set(schemas.render())
    assert committed == rendered, (
        f"{HINT} (missing: {sorted(rendered - committed)}, stale: {sorted(committed - rendered)})"
    )


def test_committed_files_match_the_models_byte_for_byte() -> None:
    differing = [
        name
        for name, content in schemas.render().items()
        if (PROTO_EVENTS / name).is_file()
        and (PROTO_EVENTS / name).read_bytes() != content.encode("utf-8")
    ]
    assert not differing, f"{HINT} (out of date: {differing})"
