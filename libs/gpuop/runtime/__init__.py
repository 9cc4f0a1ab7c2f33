"""Service runtime: settings, service definitions, and the one way a service process starts.

Sits above the bus and observability, below the services: `gpuop run` calls
`launching.run_service` with a `ServiceDefinition` found through `services.installed()`.
"""
