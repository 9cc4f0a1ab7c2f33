"""What a gpuop process tells its operators: logs, metrics, traces and health.

Every service entry point calls `logging.configure_logging` and `tracing.configure_tracing`
once, then serves `http.HealthServer` on the registry from `metrics.registry()`. The bus uses
`tracing.attached`, `logging.correlation` and `metrics.BusMetrics` around each handler;
command handlers open their span with `gpuop.bus.spans.handling`.

Import the modules as namespaces: `from gpuop.observability import tracing`.
"""
