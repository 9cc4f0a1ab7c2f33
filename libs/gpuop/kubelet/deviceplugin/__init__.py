"""Generated from `proto/kubelet/deviceplugin/v1beta1/api.proto` by `make proto`; do not edit."""
