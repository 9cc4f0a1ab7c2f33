# gpuop developer entry points. Every target creates .venv and installs the project when the
# venv is missing or older than a pyproject.toml or the lock, so a fresh clone needs only
# Python 3.11 and pip. Two distributions: gpuop (the product, what the image installs) and
# gpuop-sim (libs/gpuop-sim: the simulation the tests and the demo run on).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup lock image sbom test test-security test-slow test-driver-matrix test-all test-cluster test-node cluster-tools cluster demo lint schemas bench bench-smoke proto clean

setup: $(STAMP)

# Exactly the locked set: every dependency, the dev tools and the build backend from
# requirements/dev.lock, each file checked against its hash, then the two projects themselves
# (editable, nothing else). A dependency missing from the lock fails the lock's unit test.
$(STAMP): pyproject.toml libs/gpuop-sim/pyproject.toml requirements/dev.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
		|| { echo "error: Python 3.11 or newer is needed (tried '$(PYTHON)')" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements/dev.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . -e libs/gpuop-sim
	@touch $(STAMP)

# The locks pin every dependency with the hashes of its files, from PyPI: runtime.lock is what
# the image installs (Linux, CPython 3.11), dev.lock what `setup` installs (any platform: the
# runtime pins, the dev tools, the build backend of requirements/build.in). Written again from
# pyproject.toml, keeping the pins already there; UPGRADE=1 moves every pin to the newest.
COMPILE = $(BIN)/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)
lock:
	@test -x $(BIN)/uv || $(MAKE) --no-print-directory setup
	$(COMPILE) --python-platform linux pyproject.toml -o requirements/runtime.lock
	$(COMPILE) --universal pyproject.toml requirements/build.in --extra dev \
		--constraint requirements/runtime.lock -o requirements/dev.lock

# gpuop's image (gpuop.local/gpuop:<version>) and the NATS server's the chart runs
# (gpuop.local/nats:<version>) as OCI archives in .cache/images, for `ctr images import`, built
# without a container engine (tests/support/images): Debian bookworm's packages pinned in
# deploy/image/debian.lock (apt checks them), requirements/runtime.lock's wheels (hash-checked)
# and gpuop's wheel. The same inputs give the same digest; a second run reuses every layer.
image: $(STAMP)
	$(BIN)/python -m tests.support.images build

# A CycloneDX SBOM (JSON, validated against its schema as it is written) of what `make image`
# installs: gpuop, every package of requirements/runtime.lock with its hashes, and every
# Debian package of deploy/image/debian.lock (pkg:deb purls, the .debs' SHA-256). Those locks
# pin the image's inputs exactly, so the SBOM needs no build.
SBOM ?= dist/sbom.cdx.json
sbom: $(STAMP)
	@mkdir -p $(dir $(SBOM))
	$(BIN)/python -W ignore::UserWarning -m cyclonedx_py requirements requirements/runtime.lock \
		--pyproject pyproject.toml --mc-type application --sv 1.6 --of JSON \
		--output-reproducible -o $(SBOM)
	$(BIN)/python -m tests.support.images sbom $(SBOM)

# `test` is everything but the suites marked slow (end to end with real processes, faults,
# chaos), those marked real_cluster (the real Kubernetes control plane, built from its Go
# modules by `cluster-tools`) and those marked real_node (a real kubelet, containerd and runc
# registered with that control plane: `test-node`, root and Debian's runc, iptables and
# busybox-static); CI runs all four (.ci/run), `test-all` too. `test` needs no Go. A test
# marked real_node runs only in `test-node`, whatever other marker it carries.
# It includes the attack tests (marker `security`), so a change that opens a hole fails where
# it is made; `test-security` runs those alone and prints their tables of attempts and
# outcomes. CI runs them in a stage of their own and so leaves them out of its `test`
# (TEST_MARKERS below): no test runs twice. Attack tests that are also slow or real_cluster
# run with those suites.
# The 25 slowest tests are printed, so a test that grew shows in CI's log (the suite's budget is
# 10 minutes on two cores; a test of real processes that takes many seconds is marked `slow`).
# Each first installs the Debian tools its suites run (tests/debian-tools.sh: with root and apt,
# otherwise it stops and prints the command that installs them).
TEST_MARKERS ?= not slow and not real_cluster and not real_node
test: $(STAMP)
	@tests/debian-tools.sh test
	$(BIN)/python -m pytest -q -m "$(TEST_MARKERS)" --durations=25

test-security: $(STAMP)
	@tests/debian-tools.sh test
	$(BIN)/python -m pytest -q -s -m "security and not slow and not real_cluster and not real_node"

test-slow: $(STAMP)
	@tests/debian-tools.sh slow
	$(BIN)/python -m pytest -q -m "slow and not real_cluster and not real_node and not driver_matrix" --durations=15

# Every (branch, flavour, architecture) driver package built from Debian for the newest
# kernels, cold about 6 min each on two cores; CI's test-slow builds three of them
# (docs/driver-packages.md, "What CI builds").
test-driver-matrix: $(STAMP)
	@tests/debian-tools.sh slow
	$(BIN)/python -m pytest -q -s -m driver_matrix --durations=15

# peer-tools: the side by side's smoke (tests/bench/test_smoke.py) runs upstream's harness too
test-cluster: $(STAMP) cluster-tools peer-tools
	@tests/debian-tools.sh test
	$(BIN)/python -m pytest -q -m "real_cluster and not real_node" --durations=15

test-node: $(STAMP) cluster-tools
	@tests/debian-tools.sh node
	$(BIN)/python -m pytest -q -m real_node --durations=15

test-all: test test-slow test-cluster test-node

# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, KWOK and Helm, the
# real node's kubelet, kube-proxy, containerd (shim, ctr), CNI plugins, crictl and CoreDNS, from
# the Go modules pinned under tests/cluster/ (versions in tests/cluster/versions.env), into
# .cache/cluster-tools/bin; a second run builds nothing.
cluster-tools:
	tests/cluster/build-tools.sh

# The upstream harness of tests/bench/vs_upstream.py: NVIDIA's k8s-operator-libs upgrade state
# machine driven as the GPU Operator drives it (tests/peer/README.md), built from the Go module
# pinned in tests/peer into .cache/peer-tools/bin; a second run builds nothing.
.PHONY: peer-tools
peer-tools:
	tests/peer/build.sh

# The real control plane with one real node (a simulated GPU node's host root) and KWOK GPU
# nodes beside it, gpuop's images built and its chart installed, in the foreground for a
# person: it prints the pods, the admin kubeconfig and the image; Ctrl-C stops it. As root.
# NODES=3 (KWOK) GPUS=8 by default.
cluster: $(STAMP) cluster-tools
	@tests/debian-tools.sh node
	$(BIN)/python -m tests.support.cluster --nodes $(or $(NODES),3) --gpus $(or $(GPUS),8)

demo: $(STAMP)
	$(BIN)/gpuop demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@# gpuop-sim's editable install is an import hook, which import-linter does not follow
	PYTHONPATH=libs/gpuop-sim $(BIN)/lint-imports

schemas: $(STAMP)
	$(BIN)/python -m gpuop.events.schemas proto/events

proto: $(STAMP)
	$(BIN)/python -m gpuop.kubelet.codegen

# Every benchmark at full size, one after the other, each section of BENCHMARKS.md written again
# (the side by side with upstream's failure runs included: hours on two cores); the report and
# the last lines printed say which figures met their targets. `bench-smoke` runs each at a tiny
# size and writes nothing, as CI's slow stage does (tests/bench/test_smoke.py).
bench: $(STAMP) cluster-tools peer-tools
	$(BIN)/python -m tests.bench.run_all

bench-smoke: $(STAMP) cluster-tools peer-tools
	$(BIN)/python -m tests.bench.run_all --smoke

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
