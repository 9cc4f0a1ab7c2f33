"""Generated from `proto/kubelet/dra/v1beta1/api.proto` by `make proto`; do not edit."""
