"""The simulated API server's name rules (`gpuop_sim.apiserver.validation`): a DNS label
(a namespace's name) and a DNS subdomain (most objects'), as Kubernetes words its errors."""

from __future__ import annotations

import pytest

from gpuop_sim.apiserver.validation import (
    LABEL_MESSAGE,
    SUBDOMAIN_MESSAGE,
    dns_label_errors,
    subdomain_errors,
)


def details(errors: list) -> list[str]:
    return [error.detail for error in errors]


@pytest.mark.parametrize(
    ("check", "longest", "message"),
    [(dns_label_errors, 63, LABEL_MESSAGE), (subdomain_errors, 253, SUBDOMAIN_MESSAGE)],
)
def test_a_name_is_refused_past_its_length_or_off_its_pattern(check, longest, message):
    assert check("metadata.name", "a" * longest) == []
    too_long = details(check("metadata.name", "a" * (longest + 1)))
    assert too_long == [f"must be no more than {longest} characters"]
    assert details(check("metadata.name", "Upper")) == [message]
    both = details(check("metadata.name", "-" * (longest + 1)))
    assert both == [f"must be no more than {longest} characters", message]


def test_a_subdomain_may_have_dots_a_label_may_not():
    assert subdomain_errors("metadata.name", "gpu.example.com") == []
    assert details(dns_label_errors("metadata.name", "gpu.example.com")) == [LABEL_MESSAGE]
