"""Bearer-token authentication: every API and lab route needs a token the hub knows."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request

from lab.hub import errors


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Authenticator:
    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = dict(tokens)

    def user(self, request: Request) -> str:
        """The user behind the request's bearer token; raises 401 Unauthorized otherwise."""
        token = bearer_token(request)
        user = self._tokens.get(token) if token else None
        if user is None:
            raise errors.unauthorized()
        return user


def hub_user(request: Request) -> str:
    """FastAPI dependency for routers mounted on the hub app: `user: str = Depends(hub_user)`."""
    authenticator: Authenticator = request.app.state.hub.auth
    return authenticator.user(request)
