"""One realistic instance of every payload type, with optional fields filled in.

The catalogue tests require a sample for every registered type, so a new event or command
must add one here; filling the optional fields makes the strictness checks reach nested
records too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from ipaddress import IPv4Interface, IPv6Interface

from gpuop.events import (
    Payload,
    deadlines,
    device,
    device_api,
    device_api_commands,
    dra,
    driver,
    hardware,
    ids,
    kube,
    mig,
    mig_commands,
    mig_requests,
    network,
    remediation,
    remediation_commands,
    upgrade,
)
from gpuop.events.fields import NamespacedName

BOOT_ID = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
NEW_BOOT_ID = "0b6c7d9e-1f2a-4b3c-8d4e-5f6a7b8c9d0e"
HASH = "a" * 64
GPU_UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
CLAIM_UID = "6b1c0e2f-9a4d-4c3e-8f51-2d7a9b0c1e34"
POD_UID = "0f9e8d7c-6b5a-4c3d-9e2f-1a0b9c8d7e6f"
SAGA = "saga/gpu-node-1/1"
ROLLOUT = "rollout-580.159.04"
CMD = ids.step(SAGA, "driver-reload-required/unload", 1)
GPU = driver.Component.GPU
OFED = driver.Component.OFED
POD = NamespacedName(namespace="ml", name="trainer-0")
PDB = NamespacedName(namespace="ml", name="trainer-pdb")
SOURCE = driver.DriverSource(uri="https://drivers.example.com/nvidia/580.159.04.run", sha256=HASH)
NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def _inventory() -> hardware.HardwareDiscovered:
    draft = hardware.HardwareDiscovered(
        gpus=(
            hardware.Gpu(
                uuid=GPU_UUID,
                index=0,
                minor_number=0,
                pci_bus_id="0000:00:06.0",
                model_name="NVIDIA H200",
                memory_bytes=150754820096,
                numa_node=0,
                mig_mode=hardware.MigMode.DISABLED,
                compute_capability="9.0",
                architecture="hopper",
            ),
        ),
        pci_functions=(
            hardware.PciFunction(
                address="0000:00:06.0",
                vendor_id="10de",
                device_id="2335",
                class_id="030200",
                subsystem_vendor_id="10de",
                subsystem_device_id="18bf",
                numa_node=0,
                link_speed_gts=32.0,
                link_width=16,
                driver="nvidia",
            ),
        ),
        kernel_release="6.18.44-fc-v657-gpu",
        machine="x86_64",
        os_id="ubuntu",
        os_version_id="24.04",
        boot_id=BOOT_ID,
        driver_version="580.159.04",
        cuda_driver_version="13.0",
        ofed_version="24.10-1.1.4.0",
        modules_loaded=("nvidia", "nvidia_uvm"),
        container_runtimes=(
            hardware.ContainerRuntime(
                name=hardware.ContainerRuntimeName.CONTAINERD,
                version="1.6.20~ds1-1+deb12u3",
                nvidia_handler=True,
                cdi_enabled=False,
            ),
            hardware.ContainerRuntime(
                name=hardware.ContainerRuntimeName.CRIO,
                config_error="/etc/crio/crio.conf: Expected ']' at the end of a table declaration",
            ),
        ),
        cdi_specs=(
            hardware.CdiSpec(
                path="/var/run/cdi/nvidia.com-gpu.json", cdi_version="0.5.0", device_count=3
            ),
            hardware.CdiSpec(path="/etc/cdi/broken.yaml", error="not YAML: found unexpected end"),
        ),
        inventory_hash=HASH,
    )
    return draft.model_copy(update={"inventory_hash": draft.content_hash()})


SAMPLES: list[Payload] = [
    # hardware
    _inventory(),
    hardware.HardwareHeartbeat(
        boot_id=BOOT_ID, inventory_hash=HASH, uptime_seconds=12.5, gpu_count=8
    ),
    hardware.RescanHardware(reason="driver loaded"),
    # driver commands
    driver.UnloadDriver(component=GPU, timeout_seconds=300, allow_management_interface=True),
    driver.InstallDriver(component=GPU, version="580.159.04", source=SOURCE),
    driver.StageDriver(component=GPU, version="580.159.04", source=SOURCE),
    driver.LoadDriver(component=GPU, version="580.159.04"),
    driver.ValidateDriver(component=OFED, version="24.10-1.1.4.0", expected_devices=2),
    driver.ValidateDriver(
        component=GPU, version="535.261.03", check=driver.ValidationCheck.CUDA, timeout_seconds=270
    ),
    driver.RollbackDriver(component=GPU, version="570.86.15", source=SOURCE),
    driver.RebootNode(boot_id=BOOT_ID, reason="unload failed: in use"),
    driver.ConfigureRuntime(runtime_path="/usr/bin/nvidia-container-runtime", timeout_seconds=60),
    # driver results
    driver.DriverUnloaded(
        command_id=CMD, component=GPU, version="570.86.15", modules=("nvidia_uvm", "nvidia")
    ),
    driver.DriverUnloadFailed(
        command_id=CMD,
        component=GPU,
        message="boom",
        retryable=True,
        reason=driver.UnloadFailureReason.IN_USE,
        holding_modules=("nvidia_peermem",),
        holding_processes=(driver.Process(pid=4242, name="python", gpu_uuid=GPU_UUID, pod=POD),),
    ),
    driver.DriverInstalled(command_id=CMD, component=GPU, version="580.159.04", sha256=HASH),
    driver.DriverInstallFailed(
        command_id=CMD,
        component=GPU,
        message="boom",
        retryable=True,
        version="580.159.04",
        reason=driver.InstallFailureReason.NOT_FOUND,
    ),
    driver.DriverStaged(command_id=CMD, component=GPU, version="580.159.04", sha256=HASH),
    driver.DriverStageFailed(
        command_id=CMD,
        component=GPU,
        message="no such version",
        version="580.210.02",
        reason=driver.InstallFailureReason.NOT_FOUND,
    ),
    driver.DriverLoaded(
        command_id=CMD, component=GPU, version="580.159.04", modules=("nvidia", "nvidia_uvm")
    ),
    driver.DriverLoadFailed(
        command_id=CMD,
        component=GPU,
        message="boom",
        retryable=True,
        version="580.159.04",
        reason=driver.LoadFailureReason.MODULE_ERROR,
    ),
    driver.DriverValidated(command_id=CMD, component=GPU, version="580.159.04", devices=8),
    driver.DriverValidationFailed(
        command_id=CMD,
        component=GPU,
        message="boom",
        retryable=True,
        version="580.159.04",
        reason=driver.LoadFailureReason.UNHEALTHY,
        failing_gpus=(GPU_UUID,),
    ),
    driver.DriverRolledBack(
        command_id=CMD,
        component=GPU,
        version="570.86.15",
        from_version="580.159.04",
        restored_kernels=("6.18.50-fc-v660-gpu",),
        kernels_not_restored=("6.18.51-fc-v661-gpu",),
    ),
    driver.DriverRollbackFailed(
        command_id=CMD,
        component=GPU,
        message="boom",
        retryable=True,
        version="570.86.15",
        failed_step=driver.DriverStep.INSTALL,
    ),
    driver.RebootStarted(command_id=CMD, boot_id=BOOT_ID),
    driver.RuntimeConfigured(
        command_id=CMD,
        component=GPU,
        runtime="containerd",
        drop_in="/etc/containerd/conf.d/99-nvidia.toml",
        changed=True,
        config_version=2,
        restart_seconds=1.5,
    ),
    driver.RuntimeConfigureFailed(
        command_id=CMD,
        component=GPU,
        message="containerd did not answer within 60 s of its restart",
        reason=driver.RuntimeFailureReason.NOT_ANSWERING,
        restored=True,
    ),
    # device
    device.DeviceHealthChanged(
        gpu_uuid=GPU_UUID,
        healthy=False,
        reason=device.HealthReason.XID,
        xid=79,
        ecc_volatile_uncorrected=0,
        ecc_aggregate_uncorrected=1,
        action=device.XidAction.REBOOT,
        message="GPU has fallen off the bus",
    ),
    device.PauseOperands(components=(GPU, OFED), reason="driver upgrade"),
    device.ResumeOperands(reason="validated"),
    device.OperandPaused(command_id=CMD, service=device.OperandService.DEVICE_PLUGIN),
    device.OperandResumed(command_id=CMD, service=device.OperandService.TELEMETRY),
    device.DevicePluginConfigSelected(config="time-sliced"),
    mig_requests.MigConfigRequested(config="all-balanced"),
    device_api_commands.SetDeviceApi(api=device_api_commands.DeviceApi.DRA, reason="policy"),
    device_api_commands.DeviceApiApplied(
        api=device_api_commands.DeviceApi.DRA, serving=True, command_id=CMD
    ),
    dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace="ml", name="train-gpu-x7k2p", uid=CLAIM_UID),
        devices=(
            dra.AllocatedDevice(
                request="gpu",
                driver=dra.DRIVER,
                pool="gpu-node-1",
                device="gpu-0",
                gpu_uuid=GPU_UUID,
            ),
        ),
        configs=(
            dra.OpaqueConfig(
                source=dra.ConfigSource.CLAIM,
                requests=("gpu",),
                parameters={
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing"},
                },
            ),
        ),
        pods=(dra.PodRef(namespace="ml", name="train", uid=POD_UID),),
        resource_version="4711",
    ),
    device_api.DeviceApiSwitchStarted(
        saga_id=SAGA,
        api=device_api_commands.DeviceApi.DRA,
        previous=device_api_commands.DeviceApi.DEVICE_PLUGIN,
        reason="policy deviceAPI: dra",
    ),
    device_api.NodeDeviceApiStateChanged(
        saga_id=SAGA,
        api=device_api_commands.DeviceApi.DRA,
        from_state=device_api.DeviceApiState.DRAIN_REQUIRED,
        to_state=device_api.DeviceApiState.API_SWITCH_REQUIRED,
        reason="no pod holds a GPU of the node",
    ),
    dra.ClaimReleased(
        claim=dra.ClaimRef(namespace="ml", name="train-gpu-x7k2p", uid=CLAIM_UID), deleted=True
    ),
    mig.MigReconfigurationStarted(
        saga_id=SAGA,
        request_id=CMD,
        plan=mig.MigPlan(
            config="all-balanced",
            layouts=(
                mig_commands.GpuMigLayout(
                    gpu_index=0,
                    mig_enabled=True,
                    devices=(mig_commands.MigDeviceCount(profile="3g.71gb", count=2),),
                ),
            ),
            recarved=(
                mig.RecarvedGpu(
                    index=0,
                    uuid=GPU_UUID,
                    previous=mig_commands.GpuMigLayout(gpu_index=0, mig_enabled=False),
                ),
            ),
            other_mig_devices=0,
        ),
    ),
    mig.NodeMigStateChanged(
        saga_id=SAGA,
        config="all-balanced",
        from_state=mig.MigState.APPLY_REQUIRED,
        to_state=mig.MigState.RESTORE_REQUIRED,
        config_state=mig.ConfigState.PENDING,
        reason="MigLayoutFailed apply-failed (not restored)",
    ),
    device.DevicePluginConfigApplied(
        config="shared-4",
        requested="Time_Sliced",
        outcome=device.ConfigOutcome.UNKNOWN,
        replicas=4,
        sharing_strategy=device.SharingStrategy.TIME_SLICING,
        renamed=True,
        message="nvidia.com/device-plugin.config=Time_Sliced names no config",
    ),
    device.MpsDaemonChanged(
        resource="nvidia.com/gpu",
        state=device.MpsDaemonState.FAILED,
        replicas=4,
        gpus=8,
        restarts=1,
        message="it stopped answering on its control pipe (killed or crashed)",
    ),
    # network
    network.NetworkConfigured(
        network="rdma-net",
        interface="rdma0",
        master="ens1f0",
        mode=network.LinkMode.MACVLAN,
        mtu=9000,
        addresses=(IPv4Interface("10.10.0.5/24"), IPv6Interface("fd00::5/64")),
        policy_revision=7,
    ),
    network.NetworkFailed(
        network="rdma-net",
        reason=network.NetworkFailureReason.ADDRESSES_EXHAUSTED,
        message="pool 10.10.0.0/28 is full",
        policy_revision=7,
    ),
    network.NetworkRemoved(
        network="rdma-net",
        interface="rdma0",
        addresses=(IPv4Interface("10.10.0.5/24"),),
        policy_revision=8,
    ),
    network.RdmaDevicesDiscovered(
        devices=(
            network.RdmaDevice(
                name="mlx5_0",
                pci_address="0000:41:00.0",
                driver="mlx5_core",
                ports=(
                    network.RdmaPort(
                        number=1,
                        state=network.RdmaPortState.ACTIVE,
                        link_layer=network.RdmaLinkLayer.ETHERNET,
                        netdev="enp65s0f0np0",
                        rate="400 Gb/sec (4X NDR)",
                    ),
                ),
            ),
        ),
        management_interfaces=("enp65s0f0np0",),
    ),
    network.ApplyNetwork(policy_revision=7, policy_hash=HASH),
    # upgrade
    upgrade.NodeUpgradeStateChanged(
        rollout_id=ROLLOUT,
        from_state=upgrade.UpgradeState.DRAIN_REQUIRED,
        to_state=upgrade.UpgradeState.OPERANDS_PAUSE_REQUIRED,
        reason="drain completed",
        attempt=2,
        components=(GPU,),
        target_versions={GPU: "580.159.04"},
        previous_versions={GPU: "570.86.15"},
    ),
    upgrade.NodeAdmitted(rollout_id=ROLLOUT, saga_id=SAGA, attempt=2, canary=True),
    upgrade.SagaStarted(
        rollout_id=ROLLOUT,
        saga_id=SAGA,
        running_versions={GPU: "570.86.15", OFED: None},
        boot_id=BOOT_ID,
        unschedulable=True,
        operands=(device.OperandService.DEVICE_PLUGIN,),
        expected_devices={GPU: 8},
    ),
    upgrade.PolicyApplied(
        spec={"driver": {"gpu": {"version": "580.159.04"}}, "upgradePolicy": {"drain": {}}},
    ),
    upgrade.RolloutStarted(
        rollout_id=ROLLOUT,
        trigger=upgrade.RolloutTrigger.POLICY,
        target_versions={GPU: "580.159.04", OFED: "24.10-1.1.4.0"},
        total=8,
        max_parallel_upgrades=1,
        max_unavailable="25%",
    ),
    upgrade.RolloutProgress(
        rollout_id=ROLLOUT,
        done=3,
        failed=1,
        total=8,
        counts={upgrade.UpgradeState.UPGRADE_DONE: 3, upgrade.UpgradeState.DRAIN_REQUIRED: 1},
    ),
    upgrade.RolloutCompleted(rollout_id=ROLLOUT, done=8, failed=0, total=8, duration_seconds=3600),
    upgrade.RolloutFailed(
        rollout_id=ROLLOUT,
        done=7,
        failed=1,
        total=8,
        reason=upgrade.RolloutFailureReason.NODES_FAILED,
        message="1 node failed",
        failed_nodes=("gpu-node-3.example.com",),
    ),
    # kube
    kube.NodeObserved(
        ready=True,
        unschedulable=False,
        boot_id=BOOT_ID,
        labels={"gpuop.io/driver-upgrade-state": "upgrade-done"},
    ),
    kube.NodeRemoved(),
    kube.NodeCordoned(action_id=CMD, was_unschedulable=True),
    kube.NodeUncordoned(action_id=CMD),
    kube.NodeUntainted(action_id=CMD),
    kube.PodsObserved(gpu_pods=2, job_pods=1, drainable_pods=5, sample=(POD,)),
    kube.PodsDeleted(action_id=CMD, deleted=2),
    kube.PodDeletionFailed(
        action_id=CMD, reason=kube.EvictionFailureReason.LOCAL_STORAGE, pods=(POD,), message="x"
    ),
    kube.DrainCompleted(action_id=CMD, evicted=5),
    kube.DrainFailed(
        action_id=CMD,
        reason=kube.EvictionFailureReason.PDB_BLOCKED,
        blocking_pdb=PDB,
        pods=(POD,),
        message="eviction refused",
    ),
    kube.ValidationPodSucceeded(action_id=CMD, pod=POD),
    kube.ValidationPodFailed(
        action_id=CMD,
        pod=POD,
        reason=kube.ValidationPodFailureReason.FAILED,
        message="container validator exited 1",
    ),
    kube.ValidationObserved(validator_pods=1, ready_pods=0, not_ready=(POD,)),
    # remediation
    remediation_commands.ResetGpu(
        gpu_uuids=(GPU_UUID,), allow_driver_reload=True, timeout_seconds=120
    ),
    remediation_commands.GpuReset(
        command_id=CMD, gpu_uuids=(GPU_UUID,), method=remediation_commands.ResetMethod.DRIVER_RELOAD
    ),
    remediation_commands.GpuResetFailed(
        command_id=CMD,
        gpu_uuids=(GPU_UUID,),
        reason=remediation_commands.ResetFailureReason.IN_USE,
        message="pid 4242 (python) holds GPU-20bce083",
    ),
    remediation_commands.ListGpuHolders(gpu_uuids=(GPU_UUID,)),
    remediation_commands.GpuHoldersListed(command_id=CMD, gpu_uuids=(GPU_UUID,), pods=(POD,)),
    remediation_commands.GpuHoldersUnknown(
        command_id=CMD, message="kubelet pod-resources: no socket"
    ),
    # MIG
    mig_commands.ApplyMigLayout(
        config="all-balanced",
        layouts=(
            mig_commands.GpuMigLayout(
                gpu_index=0,
                mig_enabled=True,
                devices=(
                    mig_commands.MigDeviceCount(profile="1g.18gb", count=2),
                    mig_commands.MigDeviceCount(profile="2g.35gb", count=1),
                    mig_commands.MigDeviceCount(profile="3g.71gb", count=1),
                ),
            ),
            mig_commands.GpuMigLayout(gpu_index=1, mig_enabled=False),
        ),
        timeout_seconds=120,
    ),
    mig_commands.MigLayoutApplied(
        command_id=CMD, config="all-balanced", changed_gpus=(0,), mig_devices=4
    ),
    mig_commands.MigLayoutFailed(
        command_id=CMD,
        config="all-balanced",
        reason=mig_commands.MigFailureReason.IN_USE,
        restored=True,
        message="GPU 0: pid 4242 (python) holds it",
    ),
    # the remediation saga
    remediation.RemediationStarted(
        saga_id="remediation/gpu-node-1/1764000000",
        unhealthy={GPU_UUID: (79,)},
        action=device.XidAction.REBOOT,
        boot_id=BOOT_ID,
        driver_version="535.161.08",
        expected_devices=8,
    ),
    remediation.RemediationRefused(
        unhealthy={GPU_UUID: (79,)},
        action=device.XidAction.RESET_GPU,
        starts=3,
        max_per_hour=3,
        reopens=datetime(2026, 11, 29, 21, 0, tzinfo=UTC),
    ),
    remediation.NodeRemediationStateChanged(
        saga_id="remediation/gpu-node-1/1764000000",
        from_state=remediation.RemediationState.RESET_REQUIRED,
        to_state=remediation.RemediationState.REBOOT_REQUIRED,
        reason="GpuResetFailed reset-failed; rebooting",
        gpu_uuids=(GPU_UUID,),
    ),
    # saga
    deadlines.DeadlineExpired(
        saga_id=SAGA,
        state=upgrade.UpgradeState.DRAIN_REQUIRED,
        step="drain",
        attempt=1,
        deadline=NOW,
    ),
]
