"""Service runtime: settings, service definitions, the one way a service process starts, how
its loops wait between passes (`waiting`), and what every node agent holds (`node_agents`).

Sits above the bus and observability, below the services: `gpuop run` calls
`launching.run_service` with a `ServiceDefinition` found through `services.installed()`.
"""
