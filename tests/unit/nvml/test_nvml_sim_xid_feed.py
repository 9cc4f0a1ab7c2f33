"""XIDs another process puts under a simulated node's host root (`gpuop_sim.nvml.sim_xids`,
the demo's fault knob) reach the open watchers of every SimNvml made with that feed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.host.roots import HostRoot
from gpuop.nvml.metrics import FieldId
from gpuop.nvml.watching import XidEvent
from gpuop_sim.nvml import sim_xids
from gpuop_sim.nvml.backend import open_sim
from gpuop_sim.nvml.simulated import SimNvml

from .conftest import NVML_JSON

NODE = "gpu-node-1"


def fed(root: Path) -> SimNvml:
    sim = SimNvml(4, node=NODE, recording=NVML_JSON, xid_feed=root / sim_xids.XIDS)
    sim.init()
    return sim


def test_an_xid_put_in_the_feed_reaches_the_watcher_of_the_gpu_it_names(tmp_path: Path) -> None:
    nvml = fed(tmp_path)
    watcher = nvml.watch_events()
    uuid = nvml.device_info(2).uuid
    sim_xids.inject(tmp_path, uuid, 48)
    assert watcher.wait(100) == XidEvent(2, uuid, 48, None, None)
    assert watcher.wait(1) is None
    nvml.shutdown()


def test_only_xids_put_after_the_feed_was_made_count_and_each_once(tmp_path: Path) -> None:
    earlier = fed(tmp_path)
    sim_xids.inject(tmp_path, earlier.device_info(0).uuid, 79)
    nvml = fed(tmp_path)  # a service started after that XID: it never saw it
    watcher = nvml.watch_events()
    assert watcher.wait(1) is None
    sim_xids.inject(tmp_path, nvml.device_info(1).uuid, 48)
    assert watcher.wait(100) == XidEvent(1, nvml.device_info(1).uuid, 48, None, None)
    assert watcher.wait(1) is None


def test_malformed_lines_and_other_nodes_gpus_are_skipped(tmp_path: Path) -> None:
    nvml = fed(tmp_path)
    watcher = nvml.watch_events()
    path = tmp_path / sim_xids.XIDS
    path.parent.mkdir(parents=True)
    with path.open("a") as feed:
        feed.write('not json\n[1]\n{"gpu": 3, "xid": 48}\n{"gpu": "GPU-x", "xid": true}\n')
    sim_xids.inject(tmp_path, "GPU-of-another-node", 48)
    sim_xids.inject(tmp_path, nvml.device_info(3).uuid, 31)
    assert watcher.wait(100) == XidEvent(3, nvml.device_info(3).uuid, 31, None, None)
    assert watcher.wait(1) is None


def test_a_line_still_being_written_waits_for_its_end(tmp_path: Path) -> None:
    feed = sim_xids.XidFeed(tmp_path / sim_xids.XIDS)
    path = tmp_path / sim_xids.XIDS
    path.parent.mkdir(parents=True)
    path.write_text('{"gpu": "GPU-a", "xid": 4')
    assert feed.take() == []
    with path.open("a") as file:
        file.write("8}\n")
    assert feed.take() == [("GPU-a", 48)]


def test_an_xid_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="XID 70000"):
        sim_xids.inject(tmp_path, "GPU-a", 70000)


def test_the_sim_backend_follows_the_host_roots_feed(seeded: HostRoot) -> None:
    nvml = open_sim("2", spec="sim:2", host_root=seeded.path, node=NODE, holder_id=None)
    nvml.init()
    watcher = nvml.watch_events()
    sim_xids.inject(seeded.path, nvml.device_info(1).uuid, 48)
    event = watcher.wait(100)
    assert isinstance(event, XidEvent) and (event.index, event.xid) == (1, 48)
    nvml.shutdown()


def test_nvlink_errors_put_in_their_feed_grow_the_counters_another_process_reads(
    tmp_path: Path,
) -> None:
    replays, crc = (
        FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        FieldId.NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    )
    sim = SimNvml(8, node=NODE, recording=NVML_JSON, nvlink_feed=tmp_path / sim_xids.NVLINK)
    sim.init()  # eight GPUs: NVLink, so the error totals answer (0 until errors come)
    uuid = sim.device_info(3).uuid
    assert [f.value for f in sim.field_values(3, [replays, crc])] == [0, 0]

    sim_xids.inject_nvlink_errors(tmp_path, uuid, {replays: 150, crc: 7})
    sim_xids.inject_nvlink_errors(tmp_path, uuid, {replays: 30})
    with (tmp_path / sim_xids.NVLINK).open("a") as feed:
        feed.write('{"gpu": "GPU-x", "nvlink": {"52": -1}}\nnot json\n')

    assert [f.value for f in sim.field_values(3, [replays, crc])] == [180, 7]
    assert [f.value for f in sim.field_values(2, [replays])] == [0]
    assert [f.value for f in sim.field_values(3, [replays])] == [180], "taken once"
    with pytest.raises(ValueError, match="negative"):
        sim_xids.inject_nvlink_errors(tmp_path, uuid, {replays: -1})
    sim.shutdown()
