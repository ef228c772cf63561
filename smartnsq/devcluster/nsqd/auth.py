"""AUTH support: ask an auth callback or an nsq auth HTTP server, then check permissions.

The document both return has the shape nsqd's auth servers use::

    {"ttl": 3600, "identity": "alice", "identity_url": "https://…",
     "authorizations": [{"topic": ".*", "channels": [".*"],
                         "permissions": ["subscribe", "publish"]}]}

Topic and channel patterns are regular expressions matched anywhere in the name, as nsqd
does (anchor them with ``^…$`` to match whole names).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from smartnsq.devcluster.nsqd.options import NsqdOptions


class AuthError(Exception):
    """The auth source failed or refused (never shown to the client in detail)."""


@dataclass
class Authorization:
    topic: str
    channels: list[str]
    permissions: list[str]

    def allows(self, topic: str, channel: str) -> bool:
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        try:
            if re.search(self.topic, topic) is None:
                return False
            return any(re.search(c, channel) is not None for c in self.channels)
        except re.error:
            return False


@dataclass
class AuthState:
    identity: str = ""
    identity_url: str = ""
    authorizations: list[Authorization] = field(default_factory=list)
    expires: float = 0.0

    def expired(self) -> bool:
        return time.monotonic() >= self.expires

    def allows(self, topic: str, channel: str) -> bool:
        return any(a.allows(topic, channel) for a in self.authorizations)


def _state_from(doc: Any) -> AuthState:
    if not isinstance(doc, dict):
        raise AuthError("auth document is not an object")
    try:
        auths = [
            Authorization(
                topic=str(a.get("topic", "")),
                channels=[str(c) for c in a.get("channels") or []],
                permissions=[str(p) for p in a.get("permissions") or []],
            )
            for a in doc.get("authorizations") or []
        ]
        ttl = float(doc.get("ttl", 3600))
    except (AttributeError, TypeError, ValueError) as exc:
        raise AuthError(f"malformed auth document: {exc}") from None
    return AuthState(
        identity=str(doc.get("identity", "")),
        identity_url=str(doc.get("identity_url", "")),
        authorizations=auths,
        expires=time.monotonic() + max(ttl, 0.0),
    )


async def query(options: NsqdOptions, secret: str, remote_addr: str, tls: bool) -> AuthState:
    """Ask the configured auth source about ``secret``; raises :class:`AuthError`."""
    if options.auth_callback is not None:
        try:
            doc = await options.auth_callback(secret, remote_addr)
        except Exception as exc:
            raise AuthError(f"auth callback failed: {exc!r}") from None
        if doc is None:
            raise AuthError("auth callback refused the secret")
        return _state_from(doc)
    if options.auth_http_url:
        remote_ip = remote_addr.rpartition(":")[0] or remote_addr
        params = {"remote_ip": remote_ip, "tls": "true" if tls else "false",
                  "secret": secret, "common_name": ""}
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.get(options.auth_http_url, params=params) as resp:
                if resp.status != 200:
                    raise AuthError(f"auth server answered HTTP {resp.status}")
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AuthError(f"auth server request failed: {exc!r}") from None
        return _state_from(doc)
    raise AuthError("auth is not enabled")
