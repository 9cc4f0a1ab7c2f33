"""The inotify directory watch: every kind of change to an entry wakes it, the directory's
own deletion ends it, it cannot be set where there is nothing to watch, and closing it gives
its file descriptor back."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from gpuop.host import inotify

WAKE_TIMEOUT = 2.0


def inotify_descriptors() -> int:
    """This process's open inotify instances."""
    count = 0
    for entry in os.scandir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # scandir's own descriptor, closed
            count += os.readlink(entry.path) == "anon_inode:inotify"
    return count


async def woken(watch: inotify.DirectoryWatch) -> None:
    await asyncio.wait_for(watch.changed.wait(), WAKE_TIMEOUT)
    watch.changed.clear()


async def test_creating_changing_renaming_and_deleting_an_entry_each_wake_the_watch(
    tmp_path: Path,
) -> None:
    entry = tmp_path / "kubelet.sock"
    with inotify.DirectoryWatch(tmp_path) as watch:
        assert not watch.changed.is_set()
        entry.touch()
        await woken(watch)
        os.chmod(entry, 0o600)
        await woken(watch)
        entry.rename(tmp_path / "renamed.sock")
        await woken(watch)
        (tmp_path / "renamed.sock").unlink()
        await woken(watch)
        assert not watch.gone


async def test_a_change_inside_a_subdirectory_does_not_wake_the_watch(tmp_path: Path) -> None:
    nested = tmp_path / "nested"
    nested.mkdir()
    with inotify.DirectoryWatch(tmp_path) as watch:
        (nested / "file").write_text("not ours")
        await asyncio.sleep(0.1)
        assert not watch.changed.is_set()


async def test_deleting_the_directory_ends_the_watch(tmp_path: Path) -> None:
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    with inotify.DirectoryWatch(directory) as watch:
        directory.rmdir()
        await woken(watch)
        for _ in range(20):  # IN_DELETE_SELF and IN_IGNORED may come in two reads
            if watch.gone:
                break
            await asyncio.sleep(0.01)
        assert watch.gone


async def test_a_missing_directory_cannot_be_watched_and_leaks_nothing(tmp_path: Path) -> None:
    before = inotify_descriptors()
    with pytest.raises(inotify.WatchUnavailable, match="cannot watch"):
        inotify.DirectoryWatch(tmp_path / "missing")
    (tmp_path / "a-file").touch()
    with pytest.raises(inotify.WatchUnavailable, match="Not a directory"):
        inotify.DirectoryWatch(tmp_path / "a-file")
    assert inotify_descriptors() == before


async def test_closing_the_watch_closes_its_descriptor_once(tmp_path: Path) -> None:
    before = inotify_descriptors()
    watch = inotify.DirectoryWatch(tmp_path)
    assert inotify_descriptors() == before + 1
    watch.close()
    watch.close()
    assert inotify_descriptors() == before


async def test_many_changes_at_once_wake_the_watch_once(tmp_path: Path) -> None:
    with inotify.DirectoryWatch(tmp_path) as watch:
        for number in range(500):
            (tmp_path / f"{number:03}.sock").touch()
        await woken(watch)
        await asyncio.sleep(0.05)
        assert not watch.changed.is_set(), "the reader drained the queue in one go"
