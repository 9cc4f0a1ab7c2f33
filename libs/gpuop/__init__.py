"""gpuop: GPU and RDMA-network node operator for Kubernetes, as services on NATS JetStream."""

import os

__version__ = "0.1.0"

# gRPC's C core writes its own log lines to stderr (transport goaways at INFO among them)
# under gpuop's output. Every gpuop process, and every process it starts, keeps it quiet
# unless the user asked for it: a GRPC_VERBOSITY the user set wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
