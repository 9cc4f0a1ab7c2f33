"""A `nvidia.com/mig.config` request resolved against the policy's configs and the node's
GPUs: which GPUs are re-carved (their pods alone evicted), the layout each had at the start,
and the problems that fail a request before it touches anything."""

from __future__ import annotations

from gpuop.events import hardware as hw
from gpuop.policy.migconfig import parse
from gpuop.saga.mig import plans
from tests.support.mig_sagas import CONFIG, UUIDS, inventory, plan_for


def test_only_the_gpus_whose_layout_changes_are_recarved():
    plan = plan_for("half-balanced")
    assert [layout.gpu_index for layout in plan.layouts] == [0, 1, 2, 3]
    assert [(gpu.index, gpu.uuid) for gpu in plan.recarved] == [(0, UUIDS[0]), (1, UUIDS[1])]
    assert plan.restorable and plan.expected_mig_devices() == 8


def test_a_gpu_with_mig_on_is_recarved_and_its_start_layout_is_unknown_here():
    plan = plan_for("half-balanced", inventory(2))
    assert [gpu.index for gpu in plan.recarved] == [0, 1, 2]
    assert plan.recarved[2].previous is None and not plan.restorable


def test_gpus_the_config_leaves_alone_count_their_mig_devices_only_when_known():
    assert plan_for("first-two").expected_mig_devices() == 8
    assert plan_for("first-two", inventory(3)).expected_mig_devices() is None


def test_the_device_filter_selects_by_pci_id_as_mig_parted_does():
    other_model = plan_for("all-balanced", inventory(device_id="2330"))
    assert other_model.layouts == () and other_model.recarved == ()
    assert not other_model.problem, "a filter that matches no GPU selects nothing"
    assert len(plan_for("all-balanced").recarved) == 4


def test_problems_name_the_label_and_where_the_configs_came_from():
    assert plan_for("anything", text=None).problem == (
        "nvidia.com/mig.config=anything: no MIG configs"
    )
    unknown = plan_for("nope").problem
    assert unknown.startswith("nvidia.com/mig.config=nope: the policy's mig.config: ")
    unparsed = plans.plan("half-balanced", None, "ConfigMap mig key config.yaml: not YAML", None)
    assert unparsed.problem == (
        "nvidia.com/mig.config=half-balanced: ConfigMap mig key config.yaml: not YAML"
    )


def test_a_node_not_discovered_yet_or_a_gpu_that_cannot_do_mig_is_a_problem():
    file = parse(CONFIG)
    assert "not discovered yet" in plans.plan("half-balanced", file, "src", None).problem
    node = inventory()
    incapable = node.model_copy(
        update={"gpus": (node.gpus[0].model_copy(update={"mig_mode": hw.MigMode.UNSUPPORTED}),
                         *node.gpus[1:])}
    )  # fmt: skip
    problem = plans.plan("half-balanced", file, "src", incapable).problem
    assert "GPU(s) [0] cannot do MIG" in problem


def test_nvml_and_sysfs_addresses_of_one_function_match_and_others_do_not():
    assert plans._same_address("0000:17:00.0", "00000000:17:00.0")
    assert not plans._same_address("0001:17:00.0", "00000000:17:00.0")
    assert not plans._same_address("0000:18:00.0", "00000000:17:00.0")


BALANCED_LAYOUT = {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}


def test_a_gpu_discovery_reports_carved_as_requested_keeps_its_pods():
    plan = plan_for("half-balanced", inventory(devices={0: BALANCED_LAYOUT}))
    assert [gpu.index for gpu in plan.recarved] == [1]
    assert plan.restorable


def test_a_carved_gpu_is_recarved_with_its_reported_devices_as_the_start_layout():
    node = inventory(devices={0: {"7g.141gb": 1}})
    plan = plan_for("half-balanced", node)
    first = plan.recarved[0]
    assert first.index == 0 and first.previous is not None
    assert first.previous.mig_enabled
    assert [(d.profile, d.count) for d in first.previous.devices] == [("7g.141gb", 1)]
    assert plan.restorable


def test_devices_reported_on_the_gpus_left_alone_count_exactly():
    plan = plan_for("first-two", inventory(devices={3: {"1g.18gb": 7}}))
    assert plan.expected_mig_devices() == 8 + 7
