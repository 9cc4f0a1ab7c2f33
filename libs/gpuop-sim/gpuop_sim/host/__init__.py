"""A simulated node's host: the kernel gpuop's agents change, under a host root.

simstate    where SimKernel keeps its state in the host root
simkernel   SimKernel: `KernelOps` on the host root, and its holders API for SimNvml
standins    stand-in modprobe, rmmod, depmod executables, for the subprocess path
mpscontrol  stand-in nvidia-cuda-mps-control: a real MPS control daemon process, no GPU
seeding     a booted host root copied from the recorded H200
plugin      the driver-manager's `simulated` kernel plugin: SimKernel and SimRebooter
"""
