"""Generated from `proto/kubelet/podresources/v1/api.proto` by `make proto`; do not edit."""
