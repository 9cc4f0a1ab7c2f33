"""The `gpuop` command: one subcommand module per verb, wired together in `main`."""
