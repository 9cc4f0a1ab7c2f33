"""The simulated API server's TLS: a throwaway CA and the serving certificate it signs.

kube-apiserver serves HTTPS only, and client-go sends a kubeconfig's bearer token only over
TLS, so the simulated server does the same. ``ApiServer.start`` calls :func:`issue` for a CA
made afresh (nothing is kept on disk: the key is never written outside a temporary directory
that :func:`server_context` removes before it returns) and a certificate for ``127.0.0.1``,
``::1``, ``localhost`` and, when it is not one of them, the host the server binds. The
kubeconfig carries the CA as ``certificate-authority-data``; in-process clients (tests, the
demo) get an ``ssl.SSLContext`` trusting it from :func:`client_context`.

Keys are ECDSA P-256, which Go's TLS, OpenSSL and every Kubernetes client accept, and which
takes microseconds to make: a test suite starts hundreds of servers.

A plain HTTP request to the TLS port fails the TLS handshake and the connection closes;
kube-apiserver (Go's ``net/http``) answers it instead with ``400 Client sent an HTTP request
to an HTTPS server``. Either way the request is not served.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
VALIDITY = datetime.timedelta(days=365)
"""Long enough for a `gpuop sim apiserver` left running; the CA dies with the server anyway."""
_BACKDATE = datetime.timedelta(minutes=5)
"""Tolerates a client whose clock runs a little behind."""


@dataclass(frozen=True)
class ServingCertificates:
    """A CA and the server certificate it signed, PEM encoded."""

    ca_pem: bytes
    certificate_pem: bytes
    key_pem: bytes


def _name(common_name: str, organisation: str = "gpuop-sim") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _subject_alternative_names(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _usage(*, signs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs,
        crl_sign=signs,
        encipher_only=False,
        decipher_only=False,
    )


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as PKCS#8 PEM, unencrypted."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Authority:
    """A throwaway CA: its key and its self-signed certificate."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @staticmethod
    def create(common_name: str) -> Authority:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(signs=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return Authority(key, certificate)

    def sign(
        self,
        common_name: str,
        *,
        hosts: tuple[str, ...] = (),
        client: bool = False,
        organisation: str = "gpuop-sim",
    ) -> tuple[bytes, bytes]:
        """A new key and the certificate this CA issues for it (PEM): a server's for
        `hosts`, or with `client` a client's, whose organisation Kubernetes reads as its
        group (``system:masters``)."""
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        authority_id = self.certificate.extensions.get_extension_for_class(
            x509.SubjectKeyIdentifier
        ).value
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organisation))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(signs=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(authority_id),
                critical=False,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
        )
        if hosts:
            builder = builder.add_extension(_subject_alternative_names(hosts), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return certificate.public_bytes(serialization.Encoding.PEM), pem_key(key)


def issue(bind_host: str = "127.0.0.1") -> ServingCertificates:
    """A new CA and a serving certificate for loopback and ``bind_host``."""
    now = datetime.datetime.now(datetime.UTC)
    authority = Authority.create(f"gpuop-sim-ca@{int(now.timestamp())}")
    hosts = LOOPBACK_NAMES if bind_host in LOOPBACK_NAMES else (*LOOPBACK_NAMES, bind_host)
    certificate, key = authority.sign("gpuop-sim-apiserver", hosts=hosts)
    return ServingCertificates(ca_pem=authority.pem, certificate_pem=certificate, key_pem=key)


def server_context(certificates: ServingCertificates) -> ssl.SSLContext:
    """The listener's TLS settings: TLS 1.2 or newer, HTTP/1.1 offered over ALPN (aiohttp
    serves no HTTP/2, so Go clients must not expect it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    # load_cert_chain reads only files; they live just long enough to be read.
    with tempfile.TemporaryDirectory(prefix="gpuop-sim-tls-") as directory:
        chain, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        chain.write_bytes(certificates.certificate_pem)
        key.touch(mode=0o600)
        key.write_bytes(certificates.key_pem)
        context.load_cert_chain(chain, key)
    return context


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client context that trusts only the given CA, and checks the host name."""
    return ssl.create_default_context(cadata=ca_pem.decode("ascii"))
