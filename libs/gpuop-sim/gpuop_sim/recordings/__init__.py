"""Recordings of real GPU nodes that the simulation is made from; each is read, never edited.

`h200/` is one NVIDIA H200 node (driver 580.159.04, kernel 6.18, recorded 2026-11-29; its
README says what was read and how): `hostroot/` with the links it had in `SYMLINKS.txt`,
`nvml.json` (NVML's answers through nvidia-ml-py) and `nvidia-smi-q.xml`. It ships as package
data, so the demo and every test find it in a clone and in an installed wheel alike.
"""

from __future__ import annotations

from pathlib import Path

H200 = Path(__file__).resolve().parent / "h200"
"""The recorded H200 node."""
H200_HOST_ROOT = H200 / "hostroot"
"""The recorded H200's host root: what its node agents read under `/sys` and `/proc`."""
H200_NVML = H200 / "nvml.json"
"""NVML's answers on the recorded H200."""
H200_NVIDIA_SMI = H200 / "nvidia-smi-q.xml"
"""`nvidia-smi -q -x` on the recorded H200."""
