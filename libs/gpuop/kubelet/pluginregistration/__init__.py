"""Generated from `proto/kubelet/pluginregistration/v1/api.proto` by `make proto`; do not edit."""
