#!/usr/bin/env bash
# Rewrites the pinned modules from versions.env (after a version bump there) and resolves
# their go.sum from the module proxy:
# `tests/cluster/pin.sh [kubernetes|etcd|kwok|helm|containerd|cni|cri-tools|coredns]...` (all
# of them by default). Review and commit the go.mod and go.sum it changes.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with paths in
# its own tree; a module that imports it must replace each with the tag v0.<minor>.<patch>
# of the same release. The list is read from that release's own go.mod.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
proxy=$(go env GOPROXY)
proxy=${proxy%%,*}

fresh() {  # fresh MODULE: an empty module of that name
    rm -f "$here/$1/go.mod" "$here/$1/go.sum"
    printf 'module gpuop.invalid/tests/cluster/%s\n\ngo 1.26.0\n' "$1" >"$here/$1/go.mod"
}
pin() {
    case $1 in
    kubernetes)
        fresh kubernetes
        local staging=v0.${KUBERNETES#1.} module
        for module in $(curl -fsS "$proxy/k8s.io/kubernetes/@v/v$KUBERNETES.mod" |
            sed -n 's#^\t\(k8s.io/[^ ]*\) => ./staging/.*#\1#p'); do
            (cd "$here/kubernetes" && go mod edit "-replace=$module=$module@$staging")
        done
        (cd "$here/kubernetes" && go get -tool \
            "k8s.io/kubernetes/cmd/kube-apiserver@v$KUBERNETES" \
            "k8s.io/kubernetes/cmd/kube-controller-manager@v$KUBERNETES" \
            "k8s.io/kubernetes/cmd/kube-scheduler@v$KUBERNETES" \
            "k8s.io/kubernetes/cmd/kubectl@v$KUBERNETES" \
            "k8s.io/kubernetes/cmd/kubelet@v$KUBERNETES" \
            "k8s.io/kubernetes/cmd/kube-proxy@v$KUBERNETES")
        ;;
    etcd) fresh etcd && (cd "$here/etcd" && go get -tool "go.etcd.io/etcd/server/v3@v$ETCD") ;;
    kwok)
        fresh kwok
        (cd "$here/kwok" && go get -tool "sigs.k8s.io/kwok/cmd/kwok@v$KWOK" "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK")
        ;;
    helm) fresh helm && (cd "$here/helm" && go get -tool "helm.sh/helm/v4/cmd/helm@v$HELM") ;;
    containerd)
        fresh containerd
        (cd "$here/containerd" && go get -tool "github.com/containerd/containerd/v2/cmd/containerd@v$CONTAINERD" \
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$CONTAINERD" \
            "github.com/containerd/containerd/v2/cmd/ctr@v$CONTAINERD")
        ;;
    cni)
        fresh cni
        local plugin
        for plugin in main/bridge ipam/host-local main/loopback meta/portmap; do
            (cd "$here/cni" && go get -tool "github.com/containernetworking/plugins/plugins/$plugin@v$CNI_PLUGINS")
        done
        ;;
    cri-tools) fresh cri-tools && (cd "$here/cri-tools" && go get -tool "sigs.k8s.io/cri-tools/cmd/crictl@v$CRI_TOOLS") ;;
    coredns)
        # A CoreDNS with only the plugins the real node's cluster DNS uses (coredns/main.go).
        fresh coredns
        (cd "$here/coredns" && go get "github.com/coredns/coredns@v$COREDNS" && go mod tidy)
        ;;
    *) echo "pin.sh: no module $1 (kubernetes, etcd, kwok, helm, containerd, cni, cri-tools, coredns)" >&2 && exit 2 ;;
    esac
    echo "pin.sh: $1 pinned"
}
for module in "${@:-kubernetes etcd kwok helm containerd cni cri-tools coredns}"; do
    for one in $module; do pin "$one"; done
done
