"""API keys and roles.

A key is `ft_<key id>_<secret>`: the key id is public (it names the key in the audit log), the secret is
32 random bytes. Only the SHA-256 of the whole key is stored; a presented key is looked up by its id and
compared in constant time. SHA-256 (not a slow password hash) is enough because the secret has 256 bits
of entropy: nobody can brute-force it from the hash.

Roles are ordered: viewer < operator < approver. Every `/v1` endpoint needs a key: reads any role, writes
operator or more, approve and reject approver. `authorize` is attached centrally by `create_app` to every
router that serves `/v1`, so a router added later is covered without doing anything.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from cachetools import TTLCache
from fastapi import Depends, HTTPException, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlmodel import Session, select

from advisor.deps import get_runtime
from advisor.records import ApiKey
from advisor.timestamps import as_utc
from twin.store import utcnow

API_KEY_HEADER = "X-API-Key"
V1_PREFIX = "/v1"
KEY_PREFIX = "ft"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A route that only computes (no state changes) may declare this in its `openapi_extra` so that a viewer
# may POST to it, e.g. `POST /v1/advise`.
ACCESS_EXTENSION = "x-finetwin-access"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.APPROVER: 2}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key's public id, its name and role, and the one cluster whose API takes it (None:
    every cluster's)."""

    key_id: str
    name: str
    role: Role
    cluster_id: str | None = None
    expires_at: datetime | None = None  # aware (UTC)

    @property
    def actor(self) -> str:
        """How the audit log names this caller."""
        return f"key:{self.key_id} ({self.name})"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_key_id(key: str) -> str | None:
    parts = key.split("_", 2)  # the secret itself may contain "_"
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def create_key(
    session: Session, role: Role, name: str, cluster_id: str | None = None, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """A new key of `role`, for one cluster's API or (None) every cluster's, working until `expires_at` or
    (None) until revoked; returns the stored row and the key itself (shown once, never stored)."""
    key_id = uuid.uuid4().hex[:12]
    key = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        key_id=key_id, name=name, role=role.value, key_hash=hash_key(key), created_at=utcnow(),
        cluster_id=cluster_id, expires_at=expires_at,
    )  # fmt: skip
    session.add(row)
    return row, key


def revoke_key(session: Session, key_id: str) -> bool:
    row = session.get(ApiKey, key_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    session.add(row)
    return True


def verify_key(session: Session, key: str) -> Principal | None:
    """The principal for a presented key, or None if it is unknown, revoked or wrong."""
    key_id = parse_key_id(key)
    if key_id is None:
        return None
    row = session.get(ApiKey, key_id)
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(hash_key(key), row.key_hash):
        return None
    return Principal(
        key_id=row.key_id, name=row.name, role=Role(row.role), cluster_id=row.cluster_id,
        expires_at=as_utc(row.expires_at) if row.expires_at is not None else None,
    )  # fmt: skip


def any_key_exists(session: Session) -> bool:
    return session.exec(select(ApiKey.key_id).where(ApiKey.revoked_at.is_(None)).limit(1)).first() is not None  # type: ignore[union-attr]


class KeyCache:
    """Verified keys for a few seconds, so a burst of requests costs one database lookup per key; unknown
    keys remembered as unknown, so a repeated wrong key costs none.

    Keyed by the key's hash, never the key. A revoked key stops working within `ttl_s`; a key created after
    a failed attempt with it works within `negative_ttl_s`. The two are kept apart and each is bounded, so
    a flood of unknown keys cannot push the verified ones out.
    """

    MAX_ENTRIES = 10_000

    def __init__(self, engine: Engine, ttl_s: float, negative_ttl_s: float = 30.0) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._known: dict[str, tuple[float, Principal]] = {}
        self._unknown: TTLCache[str, bool] = TTLCache(maxsize=self.MAX_ENTRIES, ttl=negative_ttl_s)
        self._lock = threading.Lock()

    def cached(self, key: str) -> tuple[bool, Principal | None]:
        """(found, principal) from memory only: cheap enough for the event loop. (True, None) is a key
        known to be unknown."""
        digest = hash_key(key)
        now = time.monotonic()
        with self._lock:
            known = self._known.get(digest)
            if known is not None and now - known[0] < self.ttl_s:
                return True, known[1]
            if digest in self._unknown:  # the cache forgets an entry `negative_ttl_s` after it was written
                return True, None
        return False, None

    def verified_before(self, key: str) -> bool:
        """Whether this key was valid when last looked up (even if that is longer ago than `ttl_s`): such a
        key is worth a lookup from an address that failed too often (a colleague behind the same NAT)."""
        with self._lock:
            known = self._known.get(hash_key(key))
        return known is not None

    def lookup(self, key: str) -> Principal | None:
        found, principal = self.cached(key)
        if found:
            return principal
        digest = hash_key(key)
        now = time.monotonic()
        with Session(self.engine) as session:
            principal = verify_key(session, key)
        with self._lock:
            if principal is None:
                self._unknown[digest] = True  # bounded: past MAX_ENTRIES the least recently used go first
            else:  # kept after `ttl_s` too (`verified_before`); replaced at the next lookup
                self._unknown.pop(digest, None)
                if len(self._known) >= self.MAX_ENTRIES:  # only as many as there are keys: never in practice
                    self._known.clear()
                self._known[digest] = (now, principal)
        return principal


class FailureLimiter:
    """Failed key checks per client address in a sliding window: past `max_failures`, the address is told
    to wait (429) instead of having more unknown keys looked up (keys verified before are still looked up:
    others behind the same address keep working). Bounded: the longest-quiet addresses are forgotten
    first.

    Behind a reverse proxy every client has the proxy's address: `finetwin api --forwarded-allow-ips` (the
    proxy's address) makes it the client's own.
    """

    MAX_ADDRESSES = 10_000

    def __init__(self, max_failures: int, window_s: float) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> float | None:
        """Seconds until `address` may try an unknown key again, or None when it may now."""
        now = time.monotonic()
        with self._lock:
            failures = self._failures.get(address)
            if failures is None:
                return None
            while failures and now - failures[0] >= self.window_s:
                failures.popleft()
            if len(failures) < self.max_failures:
                return None
            return failures[0] + self.window_s - now

    def record_failure(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            failures = self._failures.setdefault(address, deque())
            failures.append(now)
            while len(failures) > self.max_failures:  # only the newest ones decide
                failures.popleft()
            self._failures.move_to_end(address)
            while len(self._failures) > self.MAX_ADDRESSES:
                self._failures.popitem(last=False)


_header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="finetwin keys create")
_bearer = HTTPBearer(auto_error=False, description="the same key as a bearer token")


async def presented_key(
    api_key: str | None = Security(_header),
    bearer: HTTPAuthorizationCredentials | None = Security(_bearer),
) -> str | None:
    """The key in `X-API-Key`, else in `Authorization: Bearer`: what Prometheus's `authorization`, Grafana's
    data sources and most HTTP clients send without a custom header. Async: a plain function would be run
    in the thread pool, a hop on every request."""
    if api_key:
        return api_key
    return bearer.credentials if bearer is not None else None


def too_many_failures(address: str, wait_s: float) -> str:
    return f"too many failed key checks from {address}; retry in {math.ceil(wait_s)} s"


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _missing_key(request: Request) -> str:
    """Why no key was found: none sent, or one sent under another scheme (`Basic`), which was said to be
    missing as if nothing had been sent."""
    how = f"send it in the {API_KEY_HEADER} header, or as Authorization: Bearer <key>"
    scheme = request.headers.get("authorization", "").strip().split(" ", 1)[0]
    if scheme and scheme.lower() != "bearer":
        return f"the Authorization header's scheme is {scheme[:20]!r}, which carries no finetwin key: {how}"
    return f"missing API key: {how}"


async def _authenticate(request: Request, key: str | None) -> Principal:
    """Async so that a request whose key is cached never leaves the event loop; the database is asked
    (in the thread pool) at most once per key per `auth_cache_seconds`, and not at all for an address that
    failed too often lately (429)."""
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    if not key:
        raise HTTPException(
            status_code=401, detail=_missing_key(request), headers={"WWW-Authenticate": API_KEY_HEADER}
        )
    runtime = get_runtime(request)
    cache, limiter = runtime.key_cache, runtime.auth_failures
    address = client_address(request)
    found, principal = cache.cached(key)
    if not found:
        wait_s = limiter.retry_after(address)
        if wait_s is not None and not cache.verified_before(key):
            raise HTTPException(
                status_code=429,
                detail=too_many_failures(address, wait_s),
                headers={"Retry-After": str(math.ceil(wait_s))},
            )
        principal = await run_in_threadpool(cache.lookup, key)
    if principal is None:
        limiter.record_failure(address)
        raise HTTPException(
            status_code=401, detail="invalid or revoked API key", headers={"WWW-Authenticate": API_KEY_HEADER}
        )
    # Checked here, not in the cache: a key cached a moment before its time stops at its time.
    if principal.expires_at is not None and datetime.now(UTC) >= principal.expires_at:
        raise HTTPException(
            status_code=401,
            detail=f"this key expired at {principal.expires_at:%Y-%m-%d %H:%M:%S} UTC: ask for a new one",
            headers={"WWW-Authenticate": API_KEY_HEADER},
        )
    served = runtime.parts.settings.cluster_id
    if principal.cluster_id is not None and principal.cluster_id != served:
        # 401, not 403: another key would do (the dashboard then asks for one instead of polling on). Not a
        # failed check for the limiter: the key is real, only not this API's.
        raise HTTPException(
            status_code=401,
            detail=f"this key is for cluster {principal.cluster_id!r}; this API serves cluster {served!r}",
            headers={"WWW-Authenticate": API_KEY_HEADER},
        )
    request.state.principal = principal
    return principal


def needed_role(request: Request) -> Role:
    """Reads need a viewer, writes an operator, unless the route declares otherwise."""
    route = request.scope.get("route")
    declared = (getattr(route, "openapi_extra", None) or {}).get(ACCESS_EXTENSION)
    if declared is not None:
        return Role(declared)
    return Role.VIEWER if request.method in READ_METHODS else Role.OPERATOR


def forbid(principal: Principal, needed: Role) -> None:
    if not principal.role.allows(needed):
        raise HTTPException(
            status_code=403, detail=f"this needs the {needed.value} role; the key has {principal.role.value}"
        )


async def authorize(request: Request, key: str | None = Depends(presented_key)) -> Principal | None:
    """The central check on every `/v1` route: a valid key (401), and a role fit for the route (403).

    Attached to whole routers; a route of such a router outside `/v1` (none today) stays open.
    """
    route = request.scope.get("route")
    if not getattr(route, "path", "/v1").startswith(V1_PREFIX):
        return None
    principal = await _authenticate(request, key)
    forbid(principal, needed_role(request))
    return principal


def require_role(role: Role):  # type: ignore[no-untyped-def]
    """A dependency for a route that needs more than its method implies (approve, reject)."""

    async def dependency(request: Request, key: str | None = Depends(presented_key)) -> Principal:
        principal = await _authenticate(request, key)
        forbid(principal, role)
        return principal

    return dependency


def access(role: Role) -> dict[str, str]:
    """`openapi_extra` for a route whose access differs from its method's default."""
    return {ACCESS_EXTENSION: role.value}
