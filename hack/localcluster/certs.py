"""Certificates for a loopback-only control plane, made with the openssl command line."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localcluster.errors import ClusterError

_VALID_DAYS = "30"
_SERVING_NAMES = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
)

FRONT_PROXY_CLIENT_NAME = "front-proxy-client"


@dataclass(frozen=True)
class ClusterCerts:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    # The aggregation layer: kube-apiserver proxies /apis/external.metrics.k8s.io to an extension API server (KEDA's
    # metrics server) with the front-proxy client cert, and the extension trusts the X-Remote-User headers of a
    # client cert signed by the front-proxy CA (published in kube-system/extension-apiserver-authentication).
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ClusterError("openssl is not installed: run `apt-get install -y openssl` and re-run")
    result = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {result.stderr.strip().splitlines()[-1:]}")


def signed_cert(directory: Path, name: str, subject: str, extensions: str, ca: str = "ca") -> None:
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", _VALID_DAYS, "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=directory)


def generate_certs(directory: Path) -> ClusterCerts:
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", _VALID_DAYS, "-subj", "/CN=specdec-local-ca", cwd=directory)
    signed_cert(
        directory, "apiserver", "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(_SERVING_NAMES)}\n",
    )
    # O=system:masters binds the admin identity to cluster-admin without any RBAC objects.
    signed_cert(
        directory, "admin", "/O=system:masters/CN=specdec-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "front-proxy-ca.key",
             "-out", "front-proxy-ca.crt", "-days", _VALID_DAYS, "-subj", "/CN=specdec-local-front-proxy-ca",
             cwd=directory)
    signed_cert(
        directory, "front-proxy-client", f"/CN={FRONT_PROXY_CLIENT_NAME}",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        ca="front-proxy-ca",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return ClusterCerts(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt", admin_key=directory / "admin.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
    )
