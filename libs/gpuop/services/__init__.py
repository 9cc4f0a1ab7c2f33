"""The six gpuop services; each is started by `gpuop run <service>` and never imports another."""
