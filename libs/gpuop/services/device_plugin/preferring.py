"""GetPreferredAllocation for GPUs: which of the available devices a container should get.

The kubelet asks at pod admission, one container at a time, with no deadline, so the
answer is computed from the inventory in memory, never from NVML. Same inputs, same answer:
candidates are ranked in a fixed order and ties go to the earlier one.

    whole GPUs, MIG devices   the set on the fewest NUMA nodes, then the best linked
                              (the sum of `GpuInventory.score` over its pairs: NVLink, then
                              PCIe proximity, as go-gpuallocator scores them); exhaustive
                              while the sets to try are few, greedy per NUMA node beyond
    time-sliced replicas      `distributed`, as upstream's default: each pick from the GPU
                              with the most replicas still free, then from the NUMA node
                              already chosen most
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypeVar

from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.inventory import Target

EXHAUSTIVE_LIMIT = 2000
"""Most candidate sets tried one by one (8 GPUs never need more than 70)."""

Score = Callable[[Target, Target], int]


class Candidate(Hashable, Protocol):
    """An advertised GPU device id, as `resources.GpuDevice` is."""

    @property
    def target(self) -> Target: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def replica(self) -> int | None: ...


C = TypeVar("C", bound=Candidate)


def prefer(candidates: Sequence[C], required: Sequence[C], size: int, score: Score) -> list[C]:
    """`size` devices: all of `required`, the rest from `candidates`.
    Raises `AllocationError` when that many cannot be had."""
    chosen = list(dict.fromkeys(required))
    pool = sorted(
        (d for d in dict.fromkeys(candidates) if d not in chosen),
        key=lambda d: (d.target.gpu_index, d.target.uuid, d.replica or 0),
    )
    need = size - len(chosen)
    if need < 0 or need > len(pool):
        raise AllocationError(
            f"cannot choose {size} devices from {len(pool) + len(chosen)} available"
            f" with {len(chosen)} required"
        )
    if need == 0:
        return chosen
    if any(device.replica is not None for device in (*pool, *chosen)):
        return _distributed(chosen, pool, need)
    return _best_set(chosen, pool, need, score)


def _best_set(chosen: list[C], pool: list[C], need: int, score: Score) -> list[C]:
    def rank(devices: Sequence[C]) -> tuple[int, int]:
        numa_nodes = len({device.numa_node for device in devices})
        linked = sum(score(a.target, b.target) for a, b in itertools.combinations(devices, 2))
        return (-numa_nodes, linked)

    if math.comb(len(pool), need) <= EXHAUSTIVE_LIMIT:
        options = [chosen + list(extra) for extra in itertools.combinations(pool, need)]
    else:
        numa_nodes = dict.fromkeys(device.numa_node for device in pool)
        local = [[d for d in pool if d.numa_node == node] for node in numa_nodes]
        options = [
            _greedy(chosen, devices, need, score)
            for devices in (*local, pool)
            if len(devices) >= need
        ]
    return max(options, key=rank)  # the first of the best: deterministic


def _greedy(chosen: list[C], pool: list[C], need: int, score: Score) -> list[C]:
    picked = list(chosen)
    remaining = list(pool)
    for _ in range(need):
        best = max(remaining, key=lambda d: sum(score(d.target, c.target) for c in picked))
        picked.append(best)
        remaining.remove(best)
    return picked


def _distributed(chosen: list[C], pool: list[C], need: int) -> list[C]:
    picked = list(chosen)
    remaining = list(pool)
    free = Counter(device.target for device in pool)
    for _ in range(need):
        numa_nodes = Counter(device.numa_node for device in picked)
        best = max(remaining, key=lambda d: (free[d.target], numa_nodes[d.numa_node]))
        picked.append(best)
        remaining.remove(best)
        free[best.target] -= 1
    return picked
