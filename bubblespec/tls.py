"""TLS for every bubblespec service: the settings, the contexts built from them, throwaway CAs.

`TlsSettings` is the one declaration of the TLS fields; the synchronizer's, the ranks' and
the gateway's config models inherit it, so each is a flag, an environment variable and a
config-file key of every service under the same name (`--tls-cert`, `BUBBLESPEC_TLS_CERT`,
`BUBBLESPEC_RANK_TLS_CERT`, ...):

- `tls_cert` + `tls_key`: the service serves TLS (gRPC for the synchronizer, HTTPS for the
  ranks and the gateway) with this certificate, and presents it as its client certificate to
  the servers it calls;
- `tls_ca`: the CA bundle that verifies the servers this service calls (when set, its calls
  to the synchronizer and the ranks are TLS and fail unless the server's certificate chains
  to this CA and names the host dialled), and the clients' certificates with
- `tls_client_auth`: refuse clients without a certificate signed by `tls_ca` (mutual TLS).

The bearer tokens stay as they are, on top. The helpers turn the settings into what uvicorn,
httpx and grpc take (`uvicorn_kwargs`, `client_context`, `server_credentials`,
`channel_credentials`), and `write_throwaway_pki` makes a CA and one certificate for a local
cluster (`bubblespec up --tls`) with the `cryptography` package. Only the standard library is
imported at module level; grpc and cryptography where they are used.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

#: The scheme of the HTTP servers of a service with these settings.
HTTP, HTTPS = "http", "https"


class TlsSettings(BaseModel):
    """The TLS fields every service's config model inherits (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    tls_cert: str = ""
    """PEM certificate (chain) of this server; with tls_key: serve TLS, and present it as the
    client certificate to the servers this service calls (empty: plaintext)."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_ca: str = ""
    """PEM CA bundle that verifies the servers this service calls (set: its calls to the
    synchronizer and ranks use TLS) and, with tls_client_auth, its clients' certificates."""
    tls_client_auth: bool = False
    """Require a client certificate signed by tls_ca on every connection (mutual TLS)."""

    @model_validator(mode="after")
    def _tls_consistent(self) -> Any:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        if self.tls_client_auth and not (self.tls_cert and self.tls_ca):
            raise ValueError("tls_client_auth needs tls_cert, tls_key and tls_ca")
        for name in ("tls_cert", "tls_key", "tls_ca"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ValueError(f"{name}: no such file: {path}")
        return self

    @property
    def tls_server(self) -> bool:
        """True when this service serves TLS."""
        return bool(self.tls_cert)

    @property
    def tls_client(self) -> bool:
        """True when this service's calls to other services use TLS."""
        return bool(self.tls_ca)


# ---------------------------------------------------------------------- servers
def uvicorn_kwargs(s: TlsSettings) -> dict[str, Any]:
    """The `uvicorn.Config` arguments of an HTTPS server with settings `s` ({} for plaintext)."""
    if not s.tls_server:
        return {}
    out: dict[str, Any] = {"ssl_certfile": s.tls_cert, "ssl_keyfile": s.tls_key,
                           "ssl_cert_reqs": ssl.CERT_REQUIRED if s.tls_client_auth
                           else ssl.CERT_NONE}
    if s.tls_ca:
        out["ssl_ca_certs"] = s.tls_ca
    return out


def server_credentials(s: TlsSettings) -> Any:
    """`grpc.ServerCredentials` of a gRPC server with settings `s` (None: plaintext)."""
    if not s.tls_server:
        return None
    import grpc

    root = Path(s.tls_ca).read_bytes() if s.tls_client_auth else None
    return grpc.ssl_server_credentials(
        [(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())],
        root_certificates=root, require_client_auth=s.tls_client_auth)


# ---------------------------------------------------------------------- clients
def client_context(ca: str | os.PathLike[str], cert: str | os.PathLike[str] | None = None,
                   key: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A client `ssl.SSLContext` that trusts only `ca` (hostnames checked) and presents
    `cert`/`key` when given: httpx's `verify=` and urllib's `context=`."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.fspath(ca))
    if cert:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key) if key else None)
    return ctx


def http_verify(s: TlsSettings) -> ssl.SSLContext | bool:
    """httpx's `verify=` for the calls of a service with settings `s` (True: system CAs)."""
    if not s.tls_client:
        return True
    return client_context(s.tls_ca, s.tls_cert or None, s.tls_key or None)


def channel_credentials(ca: str | os.PathLike[str], cert: str | os.PathLike[str] | None = None,
                        key: str | os.PathLike[str] | None = None) -> Any:
    """`grpc.ChannelCredentials` that trust only `ca` and present `cert`/`key` when given."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if cert and key else None,
        certificate_chain=Path(cert).read_bytes() if cert and key else None)


def sync_credentials(s: TlsSettings) -> Any:
    """The credentials of a service's channel to the synchronizer (None: plaintext)."""
    if not s.tls_client:
        return None
    return channel_credentials(s.tls_ca, s.tls_cert or None, s.tls_key or None)


def grpc_channel(address: str, credentials: Any = None,
                 options: Sequence[tuple[str, Any]] = ()) -> Any:
    """A blocking grpc channel to `address`: TLS with `credentials`, else plaintext."""
    import grpc

    if credentials is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, credentials, options=list(options))


# ---------------------------------------------------------------------- throwaway CA
@dataclass(frozen=True)
class Pki:
    """Paths of a CA certificate and of one certificate + key it signed."""

    ca: Path
    cert: Path
    key: Path

    def settings(self, client_auth: bool = True) -> dict[str, Any]:
        """The `TlsSettings` fields of a service using this certificate."""
        return {"tls_cert": str(self.cert), "tls_key": str(self.key), "tls_ca": str(self.ca),
                "tls_client_auth": client_auth}

    def flags(self, client_auth: bool = True) -> list[str]:
        """The same as command-line flags of `bubblespec sync|rank|gateway`."""
        out = ["--tls-cert", str(self.cert), "--tls-key", str(self.key),
               "--tls-ca", str(self.ca)]
        return [*out, "--tls-client-auth"] if client_auth else out


def _private_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str = "bubblespec throwaway CA", days: int = 30) -> tuple[Any, Any]:
    """(certificate, private key) of a new self-signed CA (`cryptography` objects)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _private_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca: tuple[Any, Any], hosts: Sequence[str], common_name: str = "bubblespec",
          days: int = 30) -> tuple[Any, Any]:
    """(certificate, private key) signed by `ca` for `hosts` (DNS names or IP addresses, the
    subject alternative names), good for both server and client authentication."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_cert, ca_key = ca
    key = _private_key()
    sans: list[Any] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def write_pair(directory: str | os.PathLike[str], stem: str, pair: tuple[Any, Any]
               ) -> tuple[Path, Path]:
    """Write `<stem>.pem` and `<stem>-key.pem` (mode 0600) into `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = d / f"{stem}.pem", d / f"{stem}-key.pem"
    cert_path.write_bytes(cert_pem(pair[0]))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem(pair[1]))
    return cert_path, key_path


DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def _write_pki(directory: str | os.PathLike[str], ca: tuple[Any, Any], hosts: Sequence[str],
               days: int) -> Pki:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_path = d / "ca.pem"
    ca_path.write_bytes(cert_pem(ca[0]))
    cert, key = write_pair(d, "cert", issue(ca, list(dict.fromkeys(hosts)), days=days))
    return Pki(ca=ca_path, cert=cert, key=key)


def write_throwaway_pki(directory: str | os.PathLike[str],
                        hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 30) -> Pki:
    """A new CA (`ca.pem`; its key is not kept) and one certificate for `hosts` signed by it
    (`cert.pem`, `cert-key.pem`) in `directory`: enough for a cluster whose services all
    present the same certificate. For tests, `bubblespec up --tls`, `bubblespec ray up --tls`
    and test deployments (docs/deploy.md, "TLS")."""
    return _write_pki(directory, make_ca(days=days), hosts, days)


def write_issued_pki(directory: str | os.PathLike[str], ca_cert: str | os.PathLike[str],
                     ca_key: str | os.PathLike[str], hosts: Sequence[str],
                     days: int = 30) -> Pki:
    """A certificate for `hosts` signed by an existing CA (PEM files `ca_cert`, `ca_key`),
    written with a copy of the CA certificate into `directory` like `write_throwaway_pki`:
    for clusters whose addresses are known only at start (Ray nodes' IPs)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = (x509.load_pem_x509_certificate(Path(ca_cert).read_bytes()),
          serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None))
    return _write_pki(directory, ca, hosts, days)
