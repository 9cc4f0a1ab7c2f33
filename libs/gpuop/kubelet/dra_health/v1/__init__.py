"""Generated from `proto/kubelet/dra-health/v1/api.proto` by `make proto`; do not edit."""
