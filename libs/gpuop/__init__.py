"""gpuop: GPU and RDMA-network node operator for Kubernetes, as services on NATS JetStream.

Packages, each importing only those below it (import-linter checks it, `make lint`):

    cli            `gpuop`: run, events, replay, discover, upgrade, bus (+ plugin commands)
    services       the six services; none imports another
    runtime        `gpuop run`: settings, the service lifecycle
    inventory | operands | health | saga
                   node labels from hardware; the operand pause/resume protocol; GPU health
                   rules; the pure upgrade saga (records, decisions, the fold, replay)
    kube | host | nvml | policy | kubelet
                   Kubernetes through the official client; the host root and kernel
                   modules; NVML; the GPUClusterPolicy; the kubelet's gRPC contracts
    bus            JetStream streams, consumers, KV, the nats-server launcher
    observability  logging, tracing, metrics, health endpoints
    events         every event and command, envelopes, subjects, ids (`events.ids`)
    clocks | plugins | selectors
                   the one clock; entry-point plugins; label-selector matching

The simulation the tests and the demo run on is another distribution, `gpuop_sim`
(libs/gpuop-sim); gpuop never imports it and finds it through `plugins`.
"""

import os

__version__ = "0.1.0"

# gRPC's C core writes its own log lines to stderr (transport goaways at INFO among them)
# under gpuop's output. Every gpuop process, and every process it starts, keeps it quiet
# unless the user asked for it: a GRPC_VERBOSITY the user set wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
