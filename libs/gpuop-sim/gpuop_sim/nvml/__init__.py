"""Simulated NVML: `SimNvml` answers as H200s do, seeded from the recording.

sim_gpus      identities, bus ids and NUMA of simulated GPUs
sim_fields    field values            sim_topology  NVLink and PCIe topology
sim_mig       MIG instances           simulated     SimNvml
modules       the kernel module state SimNvml is coupled to (a host root, or memory)
backend       `--nvml sim:<gpus>` (entry point `gpuop.nvml:sim`)
"""
