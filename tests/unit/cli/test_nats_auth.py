"""`gpuop nats-auth` refuses settings it cannot run with before it connects anywhere, exit 2
with the flag and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuop.bus import nkeys
from gpuop.cli import main


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    code = main.main(["nats-auth", *arguments])
    return code, capsys.readouterr().err


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "issuer.nk"
    path.write_text(nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT).seed + "\n")
    return path


def test_the_issuer_seed_is_required_and_must_be_an_account_seed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUOP_NATS_AUTH_ISSUER_SEED_FILE", raising=False)
    assert run(capsys, "--account", "ns/sa=discovery") == (
        2,
        "gpuop nats-auth: --issuer-seed-file is required\n",
    )
    missing = tmp_path / "none"
    code, said = run(capsys, "--issuer-seed-file", str(missing))
    assert code == 2
    assert f"--issuer-seed-file {missing}: No such file or directory" in said

    user = tmp_path / "user.nk"
    user.write_text(nkeys.KeyPair.generate(nkeys.Kind.USER).seed)
    code, said = run(capsys, "--issuer-seed-file", str(user))
    assert (code, "an account seed (SA...) is needed, not a user seed" in said) == (2, True)

    garbage = tmp_path / "garbage.nk"
    garbage.write_text("SAnotaseed")
    code, said = run(capsys, "--issuer-seed-file", str(garbage))
    assert code == 2
    assert "SAnotaseed" not in said  # never a seed's text in a message


def test_accounts_must_name_a_namespace_a_service_account_and_a_role(
    capsys: pytest.CaptureFixture[str], seed_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUOP_NATS_AUTH_ACCOUNTS", raising=False)
    code, said = run(capsys, "--issuer-seed-file", str(seed_file))
    assert code == 2
    assert said == "gpuop nats-auth: --account: name at least one NAMESPACE/SERVICEACCOUNT=ROLE\n"
    code, said = run(capsys, "--issuer-seed-file", str(seed_file), "--account", "sa=discovery")
    assert code == 2
    assert "expected NAMESPACE/SERVICEACCOUNT=ROLE, not 'sa=discovery'" in said
    monkeypatch.setenv("GPUOP_NATS_AUTH_ACCOUNTS", "ns/a=discovery, ns/b=root")
    code, said = run(capsys, "--issuer-seed-file", str(seed_file))
    assert code == 2
    assert "maps to 'root', which is not a gpuop role" in said


def test_a_user_lifetime_outside_a_minute_to_a_day_is_refused(
    capsys: pytest.CaptureFixture[str], seed_file: Path
) -> None:
    code, said = run(
        capsys,
        "--issuer-seed-file",
        str(seed_file),
        "--account",
        "ns/sa=discovery",
        "--max-lifetime",
        "5",
    )
    assert (code, "--max-lifetime 5: expected 60 to 86400 seconds" in said) == (2, True)


def test_a_new_issuer_secret_holds_a_seed_and_its_public_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main.main(["nats-auth", "--new-issuer-secret", "issuer", "--namespace", "gpuop"])
    secret = json.loads(capsys.readouterr().out)
    assert code == 0
    assert secret["metadata"] == {"name": "issuer", "namespace": "gpuop"}
    key = nkeys.KeyPair.from_seed(secret["stringData"]["seed"])
    assert key.kind is nkeys.Kind.ACCOUNT
    assert secret["stringData"]["issuer"] == key.public_key


def test_every_seed_file_of_a_rotation_must_be_an_account_seed(
    capsys: pytest.CaptureFixture[str], seed_file: Path, tmp_path: Path
) -> None:
    user = tmp_path / "user.nk"
    user.write_text(nkeys.KeyPair.generate(nkeys.Kind.USER).seed)
    files = f"{seed_file},{user}"
    code, said = run(capsys, "--issuer-seed-file", files, "--account", "a/b=discovery")
    assert code == 2
    assert f"--issuer-seed-file {user}: an account seed (SA...) is needed" in said


def pem_of(key: nkeys.KeyPair) -> str:
    return key.private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


def test_the_issuer_config_names_the_public_key_of_a_pem_or_a_seed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the chart's init container: the generated PEM in, callout.conf's issuer include out
    key = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    pem = tmp_path / "key.pem"
    pem.write_text(pem_of(key))
    out = tmp_path / "issuer.conf"
    code, said = run(capsys, "--issuer-seed-file", str(pem), "--issuer-config", str(out))
    assert (code, said) == (0, "")
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert lines == [f'issuer: "{key.public_key}"']
    assert key.seed not in out.read_text()

    seed = tmp_path / "issuer.nk"
    seed.write_text(key.seed)
    again = tmp_path / "again.conf"
    assert run(capsys, "--issuer-seed-file", str(seed), "--issuer-config", str(again))[0] == 0
    assert again.read_text() == out.read_text()


def test_a_pem_that_is_no_ed25519_key_or_no_text_is_refused_by_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p256 = ec.generate_private_key(ec.SECP256R1())
    other = tmp_path / "p256.pem"
    other.write_bytes(
        p256.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    out = tmp_path / "issuer.conf"
    code, said = run(capsys, "--issuer-seed-file", str(other), "--issuer-config", str(out))
    assert code == 2
    assert f"--issuer-seed-file {other}: an Ed25519 key is needed" in said
    assert not out.exists()

    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    code, said = run(capsys, "--issuer-seed-file", str(binary), "--issuer-config", str(out))
    assert (code, f"--issuer-seed-file {binary}: not text" in said) == (2, True)
    code, said = run(capsys, "--issuer-seed-file", " , ", "--issuer-config", str(out))
    assert (code, said) == (2, "gpuop nats-auth: --issuer-seed-file is required\n")
