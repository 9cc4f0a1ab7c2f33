#!/usr/bin/env bash
# Builds the real control plane's and the real node's test tools from their pinned Go modules
# into one ignored cache directory: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, and the node's kubelet and kube-proxy (k8s.io/kubernetes, one release), etcd, kwok
# and kwokctl, helm, containerd 2.x (whose `config dump` reads the runtime drop-ins gpuop
# writes) with its runc shim and ctr, the CNI plugins the node's bridge network uses (under
# bin/cni), crictl, a CoreDNS with only the plugins the node's cluster DNS uses, and
# cdi-validate (the CDI project's library reading the CDI specs gpuop writes). runc is
# Debian's (its Go module needs cgo and libseccomp). Go is a test tool here; the product
# stays Python.
#
# Each module directory beside this script pins one tool set with its own go.mod and go.sum
# (their dependency graphs do not mix: KWOK and Helm are built against other k8s.io releases
# than the control plane). A module is rebuilt only when its go.mod, go.sum, versions.env or
# its build command changed (not for a change elsewhere in this script: adding a module builds
# only that one); a second run prints "up to date" and does nothing. Go's own build and module caches
# (GOCACHE, GOMODCACHE) are shared by every run on the machine.
#
# Versions live in versions.env, one line each; `tests/cluster/pin.sh` rewrites the modules
# after a bump.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${GPUOP_CLUSTER_TOOLS:-$repo/.cache/cluster-tools}
# shellcheck source=versions.env
. "$here/versions.env"

command -v go >/dev/null || {
    echo "build-tools: no go on PATH: install Go 1.26 (see DEVELOPERS.md)" >&2
    exit 1
}
mkdir -p "$out/bin/cni" "$out/stamps"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

# stamp_of MODULE COMMAND...: the hash of what the module's build depends on (its go.mod and
# go.sum, the versions, the command that builds it), compared with the last one.
stamp_of() {
    local module=$1
    shift
    { cat "$here/$module/go.mod" "$here/$module/go.sum" "$here/versions.env"; echo "$*"; } |
        sha256sum | cut -c1-16
}
up_to_date() {
    local module=$1 stamp=$2 binary
    shift 2
    [ "$(cat "$out/stamps/$module" 2>/dev/null)" = "$stamp" ] || return 1
    for binary in "$@"; do [ -x "$out/bin/$binary" ] || return 1; done
}
build() {
    local module=$1 binaries=$2 start=$SECONDS stamp
    shift 2
    stamp=$(stamp_of "$module" "$@")
    # shellcheck disable=SC2086
    if up_to_date "$module" "$stamp" $binaries; then
        echo "build-tools: $module up to date ($binaries)"
        return 0
    fi
    echo "build-tools: building $module: $binaries"
    (cd "$here/$module" && "$@")
    echo "$stamp" >"$out/stamps/$module"
    echo "build-tools: $module built in $((SECONDS - start)) s"
}

version_pkg=k8s.io/component-base/version
k8s_flags="-s -w -X $version_pkg.gitVersion=v$KUBERNETES -X $version_pkg.gitMajor=${KUBERNETES%%.*}"
k8s_minor=${KUBERNETES#*.}
k8s_flags="$k8s_flags -X $version_pkg.gitMinor=${k8s_minor%%.*} -X $version_pkg.gitTreeState=clean"
k8s_flags="$k8s_flags -X k8s.io/client-go/pkg/version.gitVersion=v$KUBERNETES"

build kubernetes "kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy" \
    go build -trimpath -tags selinux,notest -ldflags "$k8s_flags" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
# A package path ending in /v3 would be named "server": name the binary.
build etcd etcd go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3
build kwok "kwok kwokctl" \
    go build -trimpath -ldflags "-s -w" -o "$out/bin/" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
# KWOK's own default stages, from the module just built (never committed here): nodes kept
# Ready with a lease, pods made Running and Ready, deleted pods removed. Its pod-complete
# stage is left out, so Job pods keep running as a long training job does.
stages=$out/kwok-stages
stage_names="node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease"
stage_names="$stage_names pod/fast/pod-ready pod/fast/pod-delete"
if [ ! -f "$stages/.stamp" ] || [ "$(cat "$stages/.stamp")" != "$(stamp_of kwok "$stage_names")" ]; then
    kwok_dir=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
    rm -rf "$stages" && mkdir -p "$stages"
    for stage in $stage_names; do
        cp "$kwok_dir/kustomize/stage/$stage.yaml" "$stages/"
    done
    chmod u+w "$stages"/*.yaml
    stamp_of kwok "$stage_names" >"$stages/.stamp"
    echo "build-tools: KWOK stages in $stages"
fi
build helm helm \
    go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM" \
    -o "$out/bin/helm" helm.sh/helm/v4/cmd/helm
# containerd 2.x, static (CGO_ENABLED=0: no btrfs snapshotter, which neither `config dump`
# nor the real node's overlayfs needs), its runc shim and ctr
containerd_cmd=github.com/containerd/containerd/v2/cmd
build containerd "containerd containerd-shim-runc-v2 ctr" \
    go build -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD" \
    -o "$out/bin/" "$containerd_cmd/containerd" "$containerd_cmd/containerd-shim-runc-v2" \
    "$containerd_cmd/ctr"
# The CNI plugins of the real node's pod network, in their own directory (containerd's
# bin_dir): a bridge with host-local addresses, the loopback, and portmap.
cni_plugins=github.com/containernetworking/plugins/plugins
build cni "cni/bridge cni/host-local cni/loopback cni/portmap" \
    go build -trimpath -ldflags "-s -w" -o "$out/bin/cni/" "$cni_plugins/main/bridge" \
    "$cni_plugins/ipam/host-local" "$cni_plugins/main/loopback" "$cni_plugins/meta/portmap"
build cri-tools crictl \
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRI_TOOLS" \
    -o "$out/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl
# The real node's cluster DNS: tests/cluster/coredns/main.go (no forward plugin).
build coredns coredns go build -trimpath -ldflags "-s -w" -o "$out/bin/coredns" .
# The CDI project's own library (tags.cncf.io/container-device-interface) reading specs, as
# a runtime loads them: tests/cluster/cdi/main.go.
build cdi cdi-validate go build -trimpath -ldflags "-s -w" -o "$out/bin/cdi-validate" .
echo "build-tools: tools in $out/bin"
