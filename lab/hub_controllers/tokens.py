"""Per-InfraEnv credentials, shaped like assisted-service's local-auth JWTs.

Two audiences: `image` tokens sign the ignition/ISO download URLs (the `api_key` query parameter)
and `agent` tokens are what the discovery agent presents (`X-Secret-Key`) when it registers. A token
names exactly one InfraEnv id, so an ignition from one InfraEnv cannot register into another, and an
InfraEnv re-created under the same name (new uid, new id) rejects agents booted from the old one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from enum import StrEnum


class TokenAudience(StrEnum):
    IMAGE = "image"
    AGENT = "agent"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    def __init__(self, key: bytes | None = None) -> None:
        # A fresh key per process unless given: a restarted lab invalidates old ignitions, as a
        # re-deployed assisted-service with a new signing key would.
        self._key = key or secrets.token_bytes(32)

    def issue(self, infra_env_id: str, audience: TokenAudience) -> str:
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        claims = {"infra_env_id": infra_env_id, "sub": audience.value}
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{header}.{payload}.{self._sign(f'{header}.{payload}')}"

    def verify(self, token: str | None, infra_env_id: str, audience: TokenAudience) -> bool:
        if not token or token.count(".") != 2:
            return False
        header, payload, signature = token.split(".")
        if not hmac.compare_digest(signature, self._sign(f"{header}.{payload}")):
            return False
        try:
            claims = json.loads(_unb64(payload))
        except ValueError:
            return False
        return bool(claims.get("infra_env_id") == infra_env_id and claims.get("sub") == audience.value)

    def _sign(self, signing_input: str) -> str:
        return _b64(hmac.new(self._key, signing_input.encode(), hashlib.sha256).digest())
