#!/usr/bin/env bash
# Builds the upstream harness (upstream-upgrade: NVIDIA's k8s-operator-libs upgrade state
# machine driven as the GPU Operator drives it, see README.md) from the Go module beside this
# script into .cache/peer-tools/bin (ignored). It is rebuilt only when go.mod, go.sum, a Go
# file or this script changed: a second run prints "up to date" and does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${GPUOP_PEER_TOOLS:-$repo/.cache/peer-tools}

command -v go >/dev/null || {
    echo "peer build: no go on PATH: install Go 1.26 (see DEVELOPERS.md)" >&2
    exit 1
}
mkdir -p "$out/bin"
stamp=$(cat "$here/go.mod" "$here/go.sum" "$here"/*.go "$0" | sha256sum | cut -c1-16)
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/bin/upstream-upgrade" ]; then
    echo "peer build: upstream-upgrade up to date"
    exit 0
fi
start=$SECONDS
echo "peer build: building upstream-upgrade"
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "-s -w" -o "$out/bin/upstream-upgrade" .)
echo "$stamp" >"$out/stamp"
echo "peer build: upstream-upgrade built in $((SECONDS - start)) s into $out/bin"
