"""The simulated cluster around the API server (``SimCluster``)::

wakeups     when controllers run           machines    GPU machines, Node objects
podstatus   pod status a kubelet reports   heartbeats  what a kubelet posts of its node
scheduling  the scheduler, GPU accounting  kubelet     one node's kubelet; reboots
kubelet_grpc  the kubelet's gRPC side: device plugin registration, PodResources
pod_resources what the PodResources API answers
workload_kinds  Deployments, ReplicaSets, Jobs
controllers what workload controllers share
replication Deployments and ReplicaSets    jobs        Jobs
daemons     DaemonSets                     workloads   the generated GPU workloads
nics        the simulated NICs             hosts       a node's host root
cluster     SimCluster                     cli         `gpuop sim apiserver`'s cluster
"""
