"""The manager's service object: what the routes ask, and what owns the store.

It holds the run's settings, the served certificate, the secrets-at-rest box, the start time
and the store (attached by ``main.run_manager`` once opened), answers ``/health``, and decides
login, session checks, logout and the users rules of interop.md 7.1 and 13. The node hub and
the dashboard stream attach here as they are built, so routes keep to parse, authorise, call,
answer (style.md H8).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from uuid import UUID

import trio
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, Strict, ValidationError

from appliance import errors
from appliance.http.envelope import describe_validation_error
from services.manager import auth
from services.manager.secrets import SecretBox
from services.manager.settings import ManagerSettings, TlsMode
from services.manager.store import (
    AttemptKind,
    JsonValue,
    NewUser,
    Role,
    Store,
    UserChanges,
    UserRecord,
)
from services.manager.tls import ServedCertificate

__all__ = [
    "INVALID_CREDENTIALS",
    "LOGIN_WINDOW",
    "SERVICE_CONFIG_KEY",
    "SERVICE_NAME",
    "LoginResult",
    "LoginUser",
    "ManagerHealth",
    "ManagerService",
    "Principal",
    "RuntimeSettings",
    "UserOut",
    "rfc3339",
]

SERVICE_NAME: Literal["mediaplane-manager"] = "mediaplane-manager"
SERVICE_CONFIG_KEY: Final = "MANAGER_SERVICE"
"""Where the app keeps its service (``app.config``); ``app.manager_service`` reads it."""
INVALID_CREDENTIALS = "Invalid credentials"
LOGIN_WINDOW = dt.timedelta(seconds=60)
"""interop.md 7.1: at most ``max_login_attempts`` login attempts per client IP per 60 s."""


def utc_now() -> dt.datetime:
    """The wall clock, the service's default clock."""
    return dt.datetime.now(dt.UTC)


class ManagerHealth(BaseModel):
    """``GET /health`` (interop.md 1.3): exactly these four fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["ok"] = "ok"
    service: Literal["mediaplane-manager"] = SERVICE_NAME
    version: str
    self_signed_cert: bool
    """True when the certificate served is self-signed; False in ``behind_proxy`` mode,
    where the manager serves no certificate."""


SettingValue = Annotated[int, Strict()]
"""Every setting of interop.md 7.5 is a JSON integer: strict, so ``true``, ``1.5`` and ``"5"`` are refused."""


class RuntimeSettings(BaseModel):
    """The settings of interop.md 7.5, defaults filled in: the one place their defaults and
    ranges live. Read live from the store on every use (``ManagerService.runtime_settings``).

    The store keeps only the keys that were set. A stored value that is out of range
    (written by hand) falls back to the default.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    events_retention_days: SettingValue = Field(30, ge=1, le=365)
    """Events older than this are deleted by the daily retention job."""
    ws_keepalive_interval_secs: SettingValue = Field(15, ge=1, le=300)
    """The manager's ``ping`` cadence on ``/ws/node``."""
    session_lifetime_hours: SettingValue = Field(24, ge=1, le=720)
    """The session JWT's ``exp`` and the cookies' ``Max-Age``."""
    max_login_attempts: SettingValue = Field(5, ge=1, le=100)
    """Login attempts per client IP per 60 s."""
    node_offline_threshold_secs: SettingValue = Field(30, ge=5, le=3600)
    """Silence after which a node is offline."""
    stats_broadcast_interval_ms: SettingValue = Field(1000, ge=100, le=60000)
    """The dashboard stream's pacing."""

    @classmethod
    def from_stored(cls, stored: Mapping[str, JsonValue]) -> RuntimeSettings:
        """The settings from the store's rows, each bad or missing key at its default."""
        kept: dict[str, Any] = {}
        for name in cls.model_fields:
            if name in stored:
                try:
                    cls.model_validate({name: stored[name]})
                except ValidationError:
                    continue
                kept[name] = stored[name]
        return cls.model_validate(kept)

    @classmethod
    def check_update(cls, values: Mapping[str, object]) -> dict[str, int]:
        """``values`` (``PUT /settings``'s ``settings``) once every key is known, not null and
        in range; else InvalidInput naming every bad key, never a value (interop.md 7.5, 13)."""
        problems: list[str] = []
        checked: dict[str, int] = {}
        for name, value in values.items():
            if name not in cls.model_fields:
                problems.append(f"settings.{name}: unknown key")
            elif value is None:
                problems.append(f"settings.{name}: cannot be null")
            else:
                try:
                    one = cls.model_validate({name: value})
                except ValidationError as exc:
                    problems.append(describe_validation_error(exc, "settings"))
                    continue
                checked[name] = getattr(one, name)
        if problems:
            raise errors.InvalidInput(f"Validation failed: {'; '.join(problems)}")
        return checked

    @property
    def session_lifetime(self) -> dt.timedelta:
        return dt.timedelta(hours=self.session_lifetime_hours)

    @property
    def events_retention(self) -> dt.timedelta:
        return dt.timedelta(days=self.events_retention_days)


def rfc3339(value: dt.datetime) -> str:
    """``2026-11-21T15:04:05.123Z``: UTC, milliseconds (interop.md conventions)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


Timestamp = Annotated[dt.datetime, PlainSerializer(rfc3339, return_type=str)]


class LoginUser(BaseModel):
    """The ``user`` of a login answer: exactly the fields of interop.md 7.1."""

    id: UUID
    username: str
    display_name: str | None
    email: str | None
    role: Role
    is_temporary: bool
    expires_at: Timestamp | None
    allowed_node_ids: list[UUID] | None
    is_active: bool
    last_login_at: Timestamp | None

    @classmethod
    def fields_of(cls, record: UserRecord) -> dict[str, Any]:
        """The record's public fields (never ``password_hash``) that this model names."""
        values = {name: getattr(record, name) for name in cls.model_fields}
        if record.allowed_node_ids is not None:
            values["allowed_node_ids"] = list(record.allowed_node_ids)
        return values


class UserOut(LoginUser):
    """A user record in the users routes: the login fields plus when it was created and changed."""

    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def from_record(cls, record: UserRecord) -> UserOut:
        return cls.model_validate(cls.fields_of(record))

    @staticmethod
    def login_view(record: UserRecord) -> LoginUser:
        """The login answer's ``user``."""
        return LoginUser.model_validate(LoginUser.fields_of(record))


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the user as stored now, and the session their JWT names."""

    user: UserRecord
    session_id: UUID

    @property
    def role(self) -> Role:
        return self.user.role


@dataclass(frozen=True, slots=True)
class LoginResult:
    """A successful login: what the route puts in the body and the two cookies."""

    user: UserRecord
    session_jwt: str
    csrf_token: str
    lifetime: dt.timedelta


class ManagerService:
    """One running manager. Built once at start; never does I/O in its constructor."""

    def __init__(
        self,
        settings: ManagerSettings,
        *,
        version: str,
        started_at: dt.datetime,
        certificate: ServedCertificate | None,
        store: Store | None = None,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self.version = version
        self.started_at = started_at
        """Wall-clock UTC time the process started."""
        self.certificate = certificate
        """The pair served in ``direct`` mode; None in ``behind_proxy`` mode."""
        self.secret_box = SecretBox(settings.master_key)
        """Encrypts the secrets the store keeps (interop.md 7.7)."""
        self._store = store
        self._clock = clock

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def tls_mode(self) -> TlsMode:
        return self.settings.tls_mode

    @property
    def self_signed_cert(self) -> bool:
        return self.certificate is not None and self.certificate.self_signed

    @property
    def store(self) -> Store:
        """The store; attached by ``main.run_manager`` before the first request."""
        if self._store is None:
            raise errors.Internal("the store is not open")
        return self._store

    def attach_store(self, store: Store) -> None:
        """Hands the opened store to the service (``main.run_manager``)."""
        self._store = store

    def health(self) -> ManagerHealth:
        """The ``/health`` answer; it needs nothing that can fail."""
        return ManagerHealth(version=self.version, self_signed_cert=self.self_signed_cert)

    async def runtime_settings(self) -> RuntimeSettings:
        """The live settings (interop.md 7.5), read from the store on every call."""
        return RuntimeSettings.from_stored(await self.store.get_settings())

    async def update_settings(self, values: Mapping[str, object]) -> RuntimeSettings:
        """``PUT /settings``: every key checked (InvalidInput) before any is written, in one
        transaction; the full settings after."""
        checked = RuntimeSettings.check_update(values)
        return RuntimeSettings.from_stored(await self.store.put_settings(checked))

    # --- login, sessions, logout (interop.md 7.1) --------------------------------------

    async def login(self, username: str, password: str, client_ip: str) -> LoginResult:
        """Checks the credentials and opens a session.

        In this order: RateLimited (429) when the client IP made ``max_login_attempts``
        attempts in the last 60 s (successes included; this one is then not counted),
        else the attempt is counted; InvalidInput (400) for an over-long username or
        password, before any hashing; AuthRequired (401) for an unknown user (after a
        dummy verification), a wrong password, or a disabled or expired account.
        """
        store = self.store
        current = await self.runtime_settings()
        recent = await store.count_recent_attempts(AttemptKind.LOGIN, client_ip, window=LOGIN_WINDOW)
        if recent >= current.max_login_attempts:
            raise errors.RateLimited("Too many login attempts; try again later")
        if len(username) > auth.MAX_USERNAME_CHARS or len(password) > auth.MAX_PASSWORD_CHARS:
            await store.record_attempt(AttemptKind.LOGIN, client_ip, succeeded=False)
            raise errors.InvalidInput(INVALID_CREDENTIALS)
        user = await store.get_user_by_username(username)
        if user is None:
            await trio.to_thread.run_sync(auth.dummy_verify, password)
            matched = False
        else:
            matched = await trio.to_thread.run_sync(auth.verify_password, user.password_hash, password)
        now = self._clock()
        usable = user is not None and matched and auth.user_usable(user, now)
        await store.record_attempt(AttemptKind.LOGIN, client_ip, succeeded=usable)
        if user is None or not usable:
            raise errors.AuthRequired(INVALID_CREDENTIALS)
        lifetime = current.session_lifetime
        session = await store.create_session(user.id, now + lifetime)
        await store.record_login(user.id)
        token = auth.encode_session_jwt(
            self.settings.jwt_secret.get_secret_value(),
            user_id=user.id,
            role=user.role,
            session_id=session.id,
            now=now,
            lifetime=lifetime,
        )
        fresh = await store.get_user(user.id)
        return LoginResult(user=fresh or user, session_jwt=token, csrf_token=secrets.token_hex(16), lifetime=lifetime)

    async def authenticate(self, token: str) -> Principal:
        """The caller of a session JWT; AuthRequired (401) unless the JWT verifies, its session
        is live (not revoked, not expired, restarts included) and its user is usable."""
        now = self._clock()
        claims = auth.decode_session_jwt(self.settings.jwt_secret.get_secret_value(), token, now)
        found = await self.store.get_session_and_user(claims.session_id)
        session, user = found if found is not None else (None, None)
        if session is None or session.user_id != claims.user_id or not session.is_valid_at(now):
            raise errors.AuthRequired("invalid session")
        if user is None or not auth.user_usable(user, now):
            raise errors.AuthRequired("invalid session")
        return Principal(user=user, session_id=session.id)

    async def logout(self, principal: Principal) -> None:
        """Revokes the caller's session; the row keeps the revocation across restarts."""
        await self.store.revoke_session(principal.session_id)

    # --- users (interop.md 7.1, 13) ----------------------------------------------------

    @staticmethod
    def check_may_manage(actor: Principal, target: UserRecord | None, new_role: object = None) -> None:
        """NotAllowed (403) when an admin touches a ``super_admin`` or makes one (interop.md 13).

        ``new_role`` is the role the request asks for, as sent (checked before validation,
        since 403 comes before 400).
        """
        if actor.role is Role.SUPER_ADMIN:
            return
        if new_role == Role.SUPER_ADMIN.value or (target is not None and target.role is Role.SUPER_ADMIN):
            raise errors.NotAllowed("only a super_admin may create, change or delete a super_admin")

    async def list_users(self) -> list[UserRecord]:
        """Every user, oldest first."""
        return await self.store.list_users()

    async def find_user(self, user_id: UUID) -> UserRecord | None:
        """The user, or None."""
        return await self.store.get_user(user_id)

    async def create_user(self, new: NewUser, password: str) -> UserRecord:
        """Creates ``new`` with ``password`` hashed (``new.password_hash`` is replaced).

        Duplicate (409) for a taken username."""
        password_hash = await trio.to_thread.run_sync(auth.hash_password, password)
        return await self.store.create_user(replace(new, password_hash=password_hash))

    async def update_user(self, user_id: UUID, changes: UserChanges, password: str | None) -> UserRecord:
        """Applies a partial update. A new password, or deactivation, revokes the user's sessions."""
        if password is not None:
            changes["password_hash"] = await trio.to_thread.run_sync(auth.hash_password, password)
        updated = await self.store.update_user(user_id, **changes)
        if password is not None or changes.get("is_active") is False:
            await self.store.revoke_user_sessions(user_id)
        return updated

    async def delete_user(self, user_id: UUID) -> None:
        """Deletes the user; its sessions go with it. UserNotFound (404)."""
        await self.store.delete_user(user_id)
