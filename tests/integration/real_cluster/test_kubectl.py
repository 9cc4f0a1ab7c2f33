"""kubectl 1.37 as a user runs it, against the simulated API server and the real one alike:
no version skew, `apply` with validation on (the CRD, then the example policy), `explain`
from the OpenAPI the server publishes, `auth can-i`, and a bad policy refused by the server
naming the field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop_sim import ApiServer
from tests.support.control_plane import REPO, ControlPlane, binary

pytestmark = [pytest.mark.real_cluster]

CRDS = REPO / "deploy" / "crds"
EXAMPLE = REPO / "deploy" / "examples" / "gpuclusterpolicy.yaml"
CRD = "gpuclusterpolicies.gpuop.io"


@pytest.fixture(params=["sim", "real"])
async def kubeconfig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Path]:
    if request.param == "real":
        plane: ControlPlane = request.getfixturevalue("plane")
        yield plane.write_kubeconfig(tmp_path / "kubeconfig")
        return
    async with ApiServer(kubelet_delay=None) as server:
        yield server.write_kubeconfig(tmp_path / "kubeconfig")


async def kubectl(
    kubeconfig: Path, *arguments: str, stdin: str | None = None
) -> tuple[int, str, str]:
    """kubectl in a subprocess (the simulated server answers on this test's event loop)."""
    process = await asyncio.create_subprocess_exec(
        str(binary("kubectl")), "--kubeconfig", str(kubeconfig), *arguments,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_kubectl_sees_no_version_skew(kubeconfig: Path) -> None:
    code, out, err = await kubectl(kubeconfig, "version")

    assert code == 0, err
    assert "Server Version: v1.37." in out
    assert "WARNING" not in err, err


async def test_apply_explain_and_can_i_work_with_validation_on(kubeconfig: Path) -> None:
    applied = await kubectl(kubeconfig, "apply", "-f", str(CRDS))
    assert applied[0] == 0, applied[2]
    established = await kubectl(
        kubeconfig, "wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s"
    )
    assert established[0] == 0, established[2]

    async def apply_example() -> tuple[int, str, str]:
        for _ in range(50):  # the server publishes a new CRD's OpenAPI a moment later
            answer = await kubectl(kubeconfig, "apply", "-f", str(EXAMPLE))
            if answer[0] == 0 or "the server could not find" not in answer[2]:
                return answer
            await asyncio.sleep(0.2)
        return answer

    example = await apply_example()
    explained = await kubectl(kubeconfig, "explain", "gpuclusterpolicy.spec")
    can_i = await kubectl(kubeconfig, "auth", "can-i", "list", "nodes")

    assert example[0] == 0, example[2]
    assert "gpuclusterpolicy.gpuop.io/" in example[1]
    assert explained[0] == 0, explained[2]
    assert "FIELDS:" in explained[1] and "upgradePolicy" in explained[1], explained[1]
    assert (can_i[0], can_i[1].strip()) == (0, "yes"), can_i[2]


async def test_a_bad_policy_is_refused_by_the_server_naming_the_field(kubeconfig: Path) -> None:
    applied = await kubectl(kubeconfig, "apply", "-f", str(CRDS))
    assert applied[0] == 0, applied[2]
    await kubectl(kubeconfig, "wait", "--for=condition=Established", f"crd/{CRD}")
    bad = EXAMPLE.read_text(encoding="utf-8").replace(
        "maxParallelUpgrades: 4", "maxParallelUpgrades: -1", 1
    )
    assert bad != EXAMPLE.read_text(encoding="utf-8")

    code, _, err = await kubectl(kubeconfig, "apply", "--server-side=false", "-f", "-", stdin=bad)

    assert code != 0
    assert "spec.upgradePolicy.maxParallelUpgrades" in err, err
