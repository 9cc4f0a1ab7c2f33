"""gpuop: GPU and RDMA-network node operator for Kubernetes, as services on NATS JetStream."""

__version__ = "0.1.0"
