"""The policy's `mig` section: mig-parted's file inline or the name of a ConfigMap holding
it, refused with a message that names the config and entry when it does not parse."""

from __future__ import annotations

import pytest

from gpuop.policy import validate_spec
from gpuop.policy.mig import MigPolicy, parse_configs
from tests.unit.policy.support import assert_schema_agrees, problems

GPU = {"gpu": {"version": "580.105.08"}}
GOOD = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
"""


def test_no_mig_section_means_no_configs_and_the_default_deadlines():
    spec = validate_spec({"driver": GPU})
    assert spec.mig.config is None and spec.mig.config_map is None
    assert spec.mig.deadlines.apply == 900 and spec.mig.deadlines.holders == 60
    assert "neither mig.config nor mig.configMap" in spec.mig.configs_source


def test_an_inline_config_is_parsed_when_the_policy_is_read():
    spec = validate_spec({"driver": GPU, "mig": {"config": GOOD}})
    file = parse_configs(spec.mig.config or "", spec.mig.configs_source)
    assert file.names() == ("all-balanced", "all-disabled")


def test_a_bad_inline_config_is_refused_naming_the_config_and_entry():
    bad = GOOD.replace('"1g.18gb": 2', '"1g.18gbx": 2')
    assert problems({"driver": GPU, "mig": {"config": bad}}) == [
        "spec.mig.config: all-balanced[0]: '1g.18gbx' is not a MIG profile (`1g.18gb`)"
    ]


def test_a_file_that_is_not_yaml_or_not_v1_is_refused():
    (not_v1,) = problems({"driver": GPU, "mig": {"config": "version: v2\nmig-configs: {}"}})
    assert not_v1.startswith("spec.mig.config: version must be 'v1'")
    (garbled,) = problems({"driver": GPU, "mig": {"config": "mig-configs: [\n"}})
    assert garbled.startswith("spec.mig.config: not YAML")


def test_a_configmap_names_its_source_and_both_sources_at_once_are_refused():
    spec = validate_spec({"driver": GPU, "mig": {"configMap": "default-mig-parted-config"}})
    assert spec.mig.configs_source == "ConfigMap default-mig-parted-config key config.yaml"
    both = {"config": GOOD, "configMap": "default-mig-parted-config"}
    assert problems({"driver": GPU, "mig": both}) == [
        "spec.mig.configMap: set config or configMap, not both"
    ]
    assert problems({"driver": GPU, "mig": {"configMap": "Not_A_Name"}}) == [
        "spec.mig.configMap: must be a ConfigMap name (a DNS subdomain)"
    ]


def test_a_configmap_file_that_does_not_parse_names_the_configmap():
    policy = MigPolicy(config_map="mig-layouts", config_map_key="layouts.yaml")
    with pytest.raises(ValueError, match=r"^ConfigMap mig-layouts key layouts.yaml: unknown key"):
        parse_configs("version: v1\nmig-config: {}\n", policy.configs_source)


@pytest.mark.parametrize(
    "mig",
    [
        {"config": GOOD},
        {"configMap": "default-mig-parted-config", "configMapKey": "config.yaml"},
        {"deadlines": {"apply": 0}},
        {"deadlines": {"apply": 60, "restore": 60}, "eviction": {"force": True}},
        {"eviction": {"deleteEmptyDir": "yes"}},
        {"configMapKey": "a/b"},
    ],
)
def test_the_crd_schema_and_the_models_agree_on_the_mig_section(mig):
    assert_schema_agrees({"driver": GPU, "mig": mig})
