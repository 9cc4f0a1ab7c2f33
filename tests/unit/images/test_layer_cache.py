"""The image build's layer cache (`tests.support.images.build`): a layer is made once per key
of its inputs, a new key makes it again, and pruning removes only the layers no image uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import build


def test_a_layer_is_made_once_per_key_and_pruned_when_unused(tmp_path: Path) -> None:
    made: list[str] = []

    def maker(content: str) -> Callable[[Path], None]:
        def make(tree: Path) -> None:
            made.append(content)
            (tree / "file").write_text(content)

        return make

    first = build.cached_layer(tmp_path, build.key("one"), maker("one"))
    again = build.cached_layer(tmp_path, build.key("one"), maker("one"))
    other = build.cached_layer(tmp_path, build.key("two"), maker("two"))

    assert made == ["one", "two"], "the second ask for key one found it cached"
    assert again == first and other.digest != first.digest
    kept = build.Built(tmp_path / "x.oci.tar", "gpuop.local/x:1", "sha256:0", (other,))
    removed = build.prune(tmp_path, [kept])
    assert sorted(path.name for path in removed) == sorted(
        [first.path.name, first.path.name.replace(".tar.gz", ".json")]
    )
    assert other.path.is_file() and not first.path.exists()


def test_the_key_changes_with_the_inputs_and_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    base = build.key("debian", "lock text")

    assert build.key("debian", "lock text") == base
    assert build.key("debian", "other lock") != base
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert build.key("debian", "lock text") != base
