"""A node's inventory and what it implies: shared by discovery and `gpuop discover`.

`labeling` turns a `HardwareDiscovered` inventory into the node labels that GPU Feature
Discovery and Node Feature Discovery would set, so existing workloads' selectors keep working.
"""
