"""A throwaway PKI for one local control plane.

Every sandbox (a test session or a `python -m lmeval_sandbox up`) gets its own
certificate authority, so nothing it trusts outlives it and two sandboxes on
one machine never share credentials. ECDSA P-256 keys keep generation well
under a second; the service-account signing key is RSA because that is what
every Kubernetes version accepts without extra flags.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from poller import timefmt

_VALIDITY = dt.timedelta(days=30)

__all__ = [
    "CertPair",
    "Pki",
    "ServiceChain",
    "issue_cert",
    "issue_client_cert",
    "make_pki",
    "make_webhook_pki",
    "service_serving_chain",
    "serving_ca",
]


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its unencrypted PEM key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Everything the components need, as files in one directory."""

    ca_cert: Path
    ca_key: Path
    apiserver: CertPair
    kwok_server: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    # The apiserver's identity towards kubelets (logs, exec, port-forward).
    apiserver_kubelet_client: CertPair
    sa_private_key: Path
    sa_public_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


class _Issuer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = timefmt.now()
        name = _name("lmeval-sandbox-ca")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        server_names: tuple[str, ...] = (),
        client: bool = False,
    ) -> CertPair:
        subject = _name(common_name, organization)
        return _sign(self.cert, self.key, self.directory, stem, subject, client, server_names)


def _sign(
    issuer: x509.Certificate,
    issuer_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    directory: Path,
    stem: str,
    subject: x509.Name,
    client: bool,
    server_names: tuple[str, ...],
    validity: dt.timedelta = _VALIDITY,
) -> CertPair:
    """A new key and a leaf certificate for it, written as `stem`.crt/.key in `directory`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = timefmt.now()
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_alt_names(server_names)), critical=False
        )
    cert = builder.sign(issuer_key, hashes.SHA256())
    pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)
    return pair


def make_pki(directory: Path, *, extra_server_names: tuple[str, ...] = ()) -> Pki:
    """Create a fresh CA and every certificate the sandbox uses in `directory`.

    `extra_server_names` are more names (or IPs) for the apiserver's serving
    certificate: the real node's pods reach it on the node's bridge address.
    """
    directory.mkdir(parents=True, exist_ok=True)
    issuer = _Issuer(directory)
    ca_cert = directory / "ca.crt"
    ca_key = directory / "ca.key"
    ca_cert.write_bytes(issuer.cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca_key, issuer.key)

    apiserver_names = (
        "127.0.0.1",
        "localhost",
        "10.96.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        *extra_server_names,
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private = directory / "sa.key"
    sa_public = directory / "sa.pub"
    _write_key(sa_private, sa_key)
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca_cert=ca_cert,
        ca_key=ca_key,
        apiserver=issuer.issue("apiserver", "kube-apiserver", server_names=apiserver_names),
        kwok_server=issuer.issue("kwok-server", "kwok", server_names=("127.0.0.1", "localhost")),
        admin=issuer.issue("admin", "sandbox-admin", organization="system:masters", client=True),
        controller_manager=issuer.issue(
            "controller-manager", "system:kube-controller-manager", client=True
        ),
        scheduler=issuer.issue("scheduler", "system:kube-scheduler", client=True),
        apiserver_kubelet_client=issuer.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organization="system:masters",
            client=True,
        ),
        sa_private_key=sa_private,
        sa_public_key=sa_public,
    )


def serving_ca(
    directory: Path, server_names: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> tuple[Path, CertPair]:
    """A throwaway CA of its own (``ca.crt``) and a serving certificate it signed.

    For servers that tests reach over TLS (the sample model server): nothing
    else trusts this CA, so a client succeeds only when given ``ca.crt``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    issuer = _Issuer(directory)
    ca_cert = directory / "ca.crt"
    ca_cert.write_bytes(issuer.cert.public_bytes(serialization.Encoding.PEM))
    return ca_cert, issuer.issue("server", server_names[0], server_names=server_names)


def issue_client_cert(pki: Pki, user: str, groups: tuple[str, ...] = ()) -> CertPair:
    """A client certificate for `user` (CN) in `groups` (O), signed by the sandbox CA.

    Tests act as plain users this way: the apiserver maps CN to the user name
    and each O to a group, exactly as for a real cluster's client certs.
    """
    stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
    return issue_cert(pki, stem, user, groups=groups)


def issue_cert(
    pki: Pki,
    stem: str,
    common_name: str,
    *,
    groups: tuple[str, ...] = (),
    server_names: tuple[str, ...] = (),
) -> CertPair:
    """A certificate signed by the sandbox CA, written as `stem`.crt/.key beside it.

    A client certificate (CN, O) unless `server_names` are given, in which
    case it serves those names and IPs (a kubelet's serving certificate).
    """
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    subject = x509.Name(attrs)
    directory = pki.ca_cert.parent
    return _sign(ca_cert, ca_key, directory, stem, subject, not server_names, server_names)


def _alt_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    alt: list[x509.GeneralName] = []
    for entry in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            alt.append(x509.DNSName(entry))
    return alt


def make_webhook_pki(
    directory: Path,
    ca_name: str,
    server_names: tuple[str, ...],
    validity: dt.timedelta = dt.timedelta(days=365),
) -> tuple[CertPair, CertPair]:
    """A CA of its own and a serving certificate it signs, for one webhook server.

    Kueue's certificate rotator keeps a CA and a serving certificate only if
    the CA's own certificate names `ca_name` (as a DNS name) and both stay
    valid beyond its 90-day lookahead; otherwise it makes new ones that name
    only its Service, which the apiserver could not reach on loopback. So this
    CA is separate from the sandbox's (30 days), and `server_names` carry both
    the Service name and 127.0.0.1. The CA's key is RSA (PKCS #1), the only
    kind the rotator reads back. Returns (CA, server) as `.crt`/`.key` pairs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = timefmt.now()
    name = _name(ca_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca = CertPair(directory / "ca.crt", directory / "ca.key")
    ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca.key, key)
    subject = _name(server_names[0])
    server = _sign(cert, key, directory, "tls", subject, False, server_names, validity)
    return ca, server


@dataclass(frozen=True)
class ServiceChain:
    """A root CA, an intermediate it signed, and a serving certificate the
    intermediate signed, as files: what an OpenShift service CA issues.

    `root` is what a trusted bundle holds (an ``openshift-service-ca.crt`` or
    ``odh-trusted-ca-bundle`` ConfigMap's key, a job's ``caBundle``);
    `served` is what the server presents, the leaf then the intermediate
    (``tls.crt`` of a ``kubernetes.io/tls`` Secret), with its key `key`.
    """

    root: Path
    intermediate: Path
    leaf: Path
    served: Path
    key: Path


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def service_serving_chain(
    directory: Path,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    validity: dt.timedelta = _VALIDITY,
) -> ServiceChain:
    """A fresh root -> intermediate -> leaf chain in `directory`, the leaf
    serving `dns_names` (e.g. ``model.team.svc``) and `ips`.

    Shaped like OpenShift's service-serving certificates: the root alone is
    trusted (nothing else trusts it), the server presents the leaf and the
    intermediate, so a client succeeds only when the root is in its trust
    store and it builds the chain through the intermediate. Every certificate
    carries subject and authority key identifiers, and the leaf a key usage
    and serverAuth, which strict verifiers (OpenSSL's X509_V_FLAG_X509_STRICT,
    Python 3.13's default) require.
    """
    if not dns_names and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP")
    directory.mkdir(parents=True, exist_ok=True)
    now = timefmt.now()
    start, end = now - dt.timedelta(minutes=5), now + validity

    def certificate(
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        issuer: x509.Name,
        issuer_key: ec.EllipticCurvePrivateKey,
        ca: bool,
        path_length: int | None,
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
            )
        )

    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = _name("lmeval-service-serving-signer")
    root = (
        certificate(root_name, root_key, root_name, root_key, True, 1)
        .add_extension(_ca_usage(), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    middle_key = ec.generate_private_key(ec.SECP256R1())
    middle_name = _name("lmeval-service-serving-intermediate")
    middle = (
        certificate(middle_name, middle_key, root_name, root_key, True, 0)
        .add_extension(_ca_usage(), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        certificate(_name((dns_names or ips)[0]), leaf_key, middle_name, middle_key, False, None)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_alt_names((*dns_names, *ips))), critical=False)
        .sign(middle_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    chain = ServiceChain(
        root=directory / "ca.crt",
        intermediate=directory / "intermediate.crt",
        leaf=directory / "leaf.crt",
        served=directory / "tls.crt",
        key=directory / "tls.key",
    )
    chain.root.write_bytes(root.public_bytes(pem))
    chain.intermediate.write_bytes(middle.public_bytes(pem))
    chain.leaf.write_bytes(leaf.public_bytes(pem))
    chain.served.write_bytes(leaf.public_bytes(pem) + middle.public_bytes(pem))
    _write_key(chain.key, leaf_key)
    return chain
