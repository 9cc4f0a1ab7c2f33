"""gpuop's minisign files against Debian's `minisign` binary, both ways: keys `minisign -G`
writes (encrypted, and unencrypted with `-W`, whose checksum is left zero) sign gpuop's
indexes, minisign verifies what gpuop signed, and `gpuop package keygen` makes keys minisign
uses as its own."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuop.host import packaging, signing
from tests.support.processes import GPUOP

PASSWORD = "correct horse battery staple"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUOP, *args], capture_output=True, text=True, timeout=120)


def _minisign(*args: str, stdin: str = "", cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("minisign")
    assert binary, "Debian's minisign is missing: apt-get install minisign (tests/debian-tools.sh)"
    return subprocess.run(
        [binary, *args], input=stdin, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _minisign_key(tmp_path: Path, *, password: str | None) -> tuple[Path, Path]:
    secret, public = tmp_path / "minisign.key", tmp_path / "minisign.pub"
    flags = ["-W"] if password is None else []
    stdin = "" if password is None else f"{password}\n{password}\n"
    made = _minisign("-G", *flags, "-p", str(public), "-s", str(secret), stdin=stdin, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    return secret, public


def _index(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    (source / packaging.INDEX).write_text('{"format": 2, "packages": []}\n')
    return source


@pytest.mark.parametrize("password", [None, PASSWORD], ids=["unencrypted", "encrypted"])
def test_a_key_minisign_made_signs_what_minisign_verifies(
    tmp_path: Path, password: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret, public = _minisign_key(tmp_path, password=password)
    if password is not None:
        monkeypatch.setenv(signing.PASSWORD_VARIABLE, password)
    source = _index(tmp_path)
    packaging.sign_driver_source(source, secret)
    checked = _minisign("-V", "-p", str(public), "-m", packaging.INDEX, cwd=source)
    assert checked.returncode == 0, checked.stderr
    assert "Signature and comment signature verified" in checked.stdout
    key = signing.PublicKey.from_file_text(public.read_text())
    assert packaging.read_secret_key(secret).public_key == key


def test_an_unencrypted_minisign_key_has_no_checksum_and_its_seed_is_still_checked(
    tmp_path: Path,
) -> None:
    secret, _ = _minisign_key(tmp_path, password=None)
    comment, line = secret.read_text().splitlines()[:2]
    body = bytearray(base64.b64decode(line))
    assert body[126:158] == bytes(32), "minisign -W left a checksum: this test's premise changed"
    body[70] ^= 1  # a bit of the seed: the public half no longer matches
    damaged = f"{comment}\n{base64.b64encode(bytes(body)).decode()}\n"
    with pytest.raises(signing.SignatureError, match="public half does not match"):
        signing.SecretKey.from_file_text(damaged)


def test_an_encrypted_key_without_its_password_is_refused_saying_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret, _ = _minisign_key(tmp_path, password=PASSWORD)
    monkeypatch.delenv(signing.PASSWORD_VARIABLE, raising=False)
    with pytest.raises(signing.SignatureError, match=signing.PASSWORD_VARIABLE):
        packaging.read_secret_key(secret)
    monkeypatch.setenv(signing.PASSWORD_VARIABLE, "not the password")
    with pytest.raises(signing.SignatureError, match="password does not open"):
        packaging.read_secret_key(secret)


def test_minisign_signs_with_a_key_gpuop_package_keygen_made(tmp_path: Path) -> None:
    secret, public = tmp_path / "keys" / "gpuop.key", tmp_path / "keys" / "gpuop.pub"
    made = run_cli("package", "keygen", "--secret-key", str(secret))
    assert made.returncode == 0, made.stderr
    assert secret.stat().st_mode & 0o777 == 0o600
    key = signing.PublicKey.from_file_text(public.read_text())
    assert key.to_base64() in made.stdout
    source = _index(tmp_path)
    signed = _minisign("-S", "-s", str(secret), "-m", packaging.INDEX, cwd=source)
    assert signed.returncode == 0, signed.stderr
    signature = signing.Signature.parse((source / "index.json.minisig").read_bytes())
    assert signing.verify((source / packaging.INDEX).read_bytes(), signature, [key]) == key
    again = run_cli("package", "keygen", "--secret-key", str(secret))
    assert again.returncode != 0 and "refusing to replace" in again.stderr
    assert os.stat(secret).st_size > 0
