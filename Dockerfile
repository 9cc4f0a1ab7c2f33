# syntax=docker/dockerfile:1
# One image for every gpuop service: `gpuop run <service>` (docs/operations.md). The Helm
# chart (deploy/helm/gpuop) runs it as the unprivileged user below everywhere it can, and as
# root only for the node agents that change the host (driver-manager, network-manager) or use
# the kubelet's root-owned sockets (device-plugin, telemetry).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/runtime.lock ./requirements/
COPY libs ./libs
COPY services ./services
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && cp requirements/runtime.lock /wheels/

FROM python:3.11-slim
# kmod's tools and systemctl come from the host (chroot /host), NVML from the host's driver
# through the NVIDIA container runtime: the image needs nothing beyond Python. The chart
# joins the base image's public CA bundle with the NATS server's CA, so it must be there.
# The dependencies are exactly requirements/runtime.lock, each file checked against its hash
# (`make lock`; `make sbom` lists them); gpuop's own wheel brings nothing else.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --require-hashes --no-deps -r /wheels/runtime.lock \
    && pip install --no-cache-dir --no-deps /wheels/*.whl \
    && rm -rf /wheels \
    && test -s /etc/ssl/certs/ca-certificates.crt \
    && groupadd --system --gid 10001 gpuop \
    && useradd --system --uid 10001 --gid gpuop --no-create-home --shell /usr/sbin/nologin gpuop
USER 10001:10001
ENTRYPOINT ["gpuop"]
CMD ["--help"]
