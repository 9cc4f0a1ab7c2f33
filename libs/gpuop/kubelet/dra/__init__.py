"""Generated from `proto/kubelet/dra/v1/api.proto` by `make proto`; do not edit."""
