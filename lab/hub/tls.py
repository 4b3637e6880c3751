"""A self-signed serving certificate for the hub twin, made with the `openssl` command.

kubectl (client-go's clientcmd) sends a kubeconfig's credentials only over TLS, so a hub that kubectl
must talk to serves https. The certificate names 127.0.0.1 and localhost and is its own CA.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    cert: Path  # PEM; also the CA bundle clients trust
    key: Path


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def self_signed_certificate(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make the hub twin's TLS certificate")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "hub-tls.crt", directory / "hub-tls.key"
    names = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "3650",
            "-subj",
            "/CN=osac-hub-twin",
            "-addext",
            f"subjectAltName={names}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyCertSign",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return TlsFiles(cert, key)
