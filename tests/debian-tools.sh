#!/usr/bin/env bash
# The Debian tools the suites run, installed when missing: `make test`, `make test-slow` and
# `.ci/run` call this first. With root (or sudo) and apt it installs what is missing; otherwise
# it stops at once and prints the one command that installs them.
#
#   tests/debian-tools.sh test   kmod (modinfo and depmod, which the driver package tests run on
#                                real modules), prometheus (telemetry's scrape test) and minisign
#                                (gpuop's keys and signatures against the reference tool)
#   tests/debian-tools.sh slow   the above, and what building NVIDIA's modules from Debian's
#                                packages needs (make, gcc-12, binutils, dpkg, the archive
#                                keyring; for arm64, Debian's cross compiler and binutils:
#                                modules need no cross libc, so not crossbuild-essential-arm64),
#                                and Debian's containerd 1.6 for the drop-in tests
#   tests/debian-tools.sh node   the first set, and what the real node runs (make test-node):
#                                runc (its Go module needs cgo and libseccomp), iptables for
#                                kube-proxy, busybox-static for the node's images, tcpdump
#                                for the DNS capture
set -euo pipefail

# tool:package pairs; a tool is looked for on PATH and in the sbin directories.
declare -A sets=(
    [test]="modinfo:kmod depmod:kmod prometheus:prometheus minisign:minisign"
    [slow]="strip:binutils make:make gcc-12:gcc-12 dpkg-deb:dpkg containerd:containerd
            aarch64-linux-gnu-gcc-12:gcc-12-aarch64-linux-gnu
            aarch64-linux-gnu-strip:binutils-aarch64-linux-gnu"
    [node]="runc:runc iptables:iptables busybox:busybox-static tcpdump:tcpdump"
)

pairs=(${sets[test]})
for set in "$@"; do
    [ -n "${sets[$set]+x}" ] || { echo "error: unknown tool set '$set' (test, slow, node)" >&2; exit 2; }
    [ "$set" = test ] || pairs+=(${sets[$set]})
done
missing=()
for pair in "${pairs[@]}"; do
    tool=${pair%%:*} package=${pair##*:}
    PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null && continue
    [[ " ${missing[*]-} " == *" $package "* ]] || missing+=("$package")
done
if [[ " $* " == *" slow "* ]] && [ ! -e /usr/share/keyrings/debian-archive-keyring.gpg ]; then
    missing+=(debian-archive-keyring)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v apt-get >/dev/null || { [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; }; then
    echo "error: the test suites need Debian's ${missing[*]}; install them, then run make again:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
echo "installing Debian's ${missing[*]} (the test suites run them)"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The package's daemon, where its init starts one, listens on every address; the tests start
# their own Prometheus on loopback with a temporary config.
if [[ " ${missing[*]} " == *" prometheus "* ]] && pgrep -x prometheus >/dev/null; then
    $sudo systemctl disable --now prometheus 2>/dev/null || $sudo service prometheus stop || true
fi
