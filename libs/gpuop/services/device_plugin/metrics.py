"""The device plugin's own metrics, on the service's /metrics.

    gpuop_device_plugin_devices{resource,health}          devices advertised, by health
    gpuop_device_plugin_allocations_total{resource,outcome}  Allocate calls: ok or refused
    gpuop_device_plugin_registrations_total{resource,outcome}  Register calls: ok or failed
    gpuop_device_plugin_config{config}                     1 for the named config in force
    gpuop_device_plugin_config_selections_total{outcome}   label changes answered: selected,
                                                          default, unknown or refused

Updated by `serving.PluginServer`, `registering.Registrar` and `plugins.DevicePlugins`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2


class PluginMetrics:
    """The device plugin's instruments in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._devices = Gauge(
            "gpuop_device_plugin_devices",
            "Devices advertised to the kubelet, by resource and health.",
            ["resource", "health"],
            registry=registry,
        )
        self._allocations = Counter(
            "gpuop_device_plugin_allocations",
            "Allocate calls answered, by resource and outcome (ok, refused).",
            ["resource", "outcome"],
            registry=registry,
        )
        self._config = Gauge(
            "gpuop_device_plugin_config",
            "1 for the named device plugin config in force on the node.",
            ["config"],
            registry=registry,
        )
        self._selections = Counter(
            "gpuop_device_plugin_config_selections",
            "Config selections answered, by outcome (selected, default, unknown, refused).",
            ["outcome"],
            registry=registry,
        )
        self._registrations = Counter(
            "gpuop_device_plugin_registrations",
            "Registrations with the kubelet, by resource and outcome (ok, failed).",
            ["resource", "outcome"],
            registry=registry,
        )

    def advertised(self, resource: str, devices: Iterable[api_pb2.Device]) -> None:
        healthy = unhealthy = 0
        for device in devices:
            if device.health == constants.HEALTHY:
                healthy += 1
            else:
                unhealthy += 1
        self._devices.labels(resource, constants.HEALTHY).set(healthy)
        self._devices.labels(resource, constants.UNHEALTHY).set(unhealthy)

    def allocation(self, resource: str, *, ok: bool) -> None:
        self._allocations.labels(resource, "ok" if ok else "refused").inc()

    def registration(self, resource: str, *, ok: bool) -> None:
        self._registrations.labels(resource, "ok" if ok else "failed").inc()

    def config_in_force(self, name: str) -> None:
        self._config.clear()
        self._config.labels(name).set(1)

    def config_selection(self, outcome: str) -> None:
        self._selections.labels(outcome).inc()
