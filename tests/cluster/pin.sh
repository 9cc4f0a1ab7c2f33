#!/usr/bin/env bash
# Rewrites the pinned modules from versions.env (after a version bump there) and resolves
# their go.sum from the module proxy:
# `tests/cluster/pin.sh [kubernetes|etcd|kwok|helm|containerd]...` (all five by default). Review and commit the go.mod and go.sum it changes.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with paths in
# its own tree; a module that imports it must replace each with the tag v0.<minor>.<patch>
# of the same release. The list is read from that release's own go.mod.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
proxy=${GOPROXY%%,*}

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
            "k8s.io/kubernetes/cmd/kubectl@v$KUBERNETES")
        ;;
    etcd) fresh etcd && (cd "$here/etcd" && go get -tool "go.etcd.io/etcd/server/v3@v$ETCD") ;;
    kwok)
        fresh kwok
        (cd "$here/kwok" && go get -tool "sigs.k8s.io/kwok/cmd/kwok@v$KWOK" "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK")
        ;;
    helm) fresh helm && (cd "$here/helm" && go get -tool "helm.sh/helm/v4/cmd/helm@v$HELM") ;;
    containerd)
        fresh containerd
        (cd "$here/containerd" && go get -tool "github.com/containerd/containerd/v2/cmd/containerd@v$CONTAINERD")
        ;;
    *) echo "pin.sh: no module $1 (kubernetes, etcd, kwok, helm, containerd)" >&2 && exit 2 ;;
    esac
    echo "pin.sh: $1 pinned"
}
for module in "${@:-kubernetes etcd kwok helm containerd}"; do
    for one in $module; do pin "$one"; done
done
