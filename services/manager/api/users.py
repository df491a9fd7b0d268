"""``/api/v1/users`` (interop.md 7.1, 13): admin and above; super_admins only by super_admins.

- ``GET /api/v1/users``: a bare array of user records, oldest first.
- ``POST /api/v1/users``: ``{username, password, role, display_name?, email?,
  allowed_node_ids?, is_temporary?, expires_at?}`` → 201 with the record.
- ``GET /api/v1/users/{id}``, ``PUT /api/v1/users/{id}`` (any subset of the POST keys plus
  ``is_active``) → 200 with the record; ``DELETE /api/v1/users/{id}`` → 204.

A record never carries the password hash. An admin who creates a super_admin, sets a role to
super_admin, or changes or deletes a super_admin gets 403, checked before the body is
validated (400) and the user looked up (404): interop.md 13's order. Error texts name JSON
paths, never the values sent.
"""

from __future__ import annotations

from typing import Final
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    TypeAdapter,
    field_validator,
    model_validator,
)
from quart import Blueprint, Response

from appliance import errors
from appliance.http.app import read_json_object, validate
from appliance.http.envelope import json_response
from services.manager import auth
from services.manager.api.auth_routes import current_principal, require, service
from services.manager.service import ManagerService, UserOut
from services.manager.store import NewUser, Role, UserChanges

__all__ = ["UserCreate", "UserUpdate", "bp"]

bp = Blueprint("manager_users", __name__)


def _check_username(value: str) -> str:
    problem = auth.username_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_password(value: str) -> str:
    problem = auth.password_problem(value)
    if problem:
        raise ValueError(problem)
    return value


class UserCreate(BaseModel):
    """``POST /api/v1/users`` (interop.md 13)."""

    model_config = ConfigDict(extra="forbid")

    username: StrictStr
    password: StrictStr
    role: Role
    display_name: StrictStr | None = Field(None, max_length=128)
    email: StrictStr | None = Field(None, max_length=254)
    allowed_node_ids: list[UUID] | None = None
    is_temporary: StrictBool = False
    expires_at: AwareDatetime | None = None

    _username = field_validator("username")(_check_username)
    _password = field_validator("password")(_check_password)

    def to_new_user(self) -> NewUser:
        """The store's record; its hash is set by the service."""
        return NewUser(
            username=self.username,
            password_hash="",
            role=self.role,
            display_name=self.display_name,
            email=self.email,
            allowed_node_ids=None if self.allowed_node_ids is None else tuple(self.allowed_node_ids),
            is_temporary=self.is_temporary,
            expires_at=self.expires_at,
        )


_NOT_NULL: Final = ("username", "password", "role", "is_temporary", "is_active")


class UserUpdate(BaseModel):
    """``PUT /api/v1/users/{id}``: any subset of the POST keys plus ``is_active``."""

    model_config = ConfigDict(extra="forbid")

    username: StrictStr | None = None
    password: StrictStr | None = None
    role: Role | None = None
    display_name: StrictStr | None = Field(None, max_length=128)
    email: StrictStr | None = Field(None, max_length=254)
    allowed_node_ids: list[UUID] | None = None
    is_temporary: StrictBool | None = None
    expires_at: AwareDatetime | None = None
    is_active: StrictBool | None = None

    @field_validator("username")
    @classmethod
    def _username_ok(cls, value: str | None) -> str | None:
        return None if value is None else _check_username(value)

    @field_validator("password")
    @classmethod
    def _password_ok(cls, value: str | None) -> str | None:
        return None if value is None else _check_password(value)

    @model_validator(mode="after")
    def _no_null_where_not_nullable(self) -> UserUpdate:
        nulls = [name for name in _NOT_NULL if name in self.model_fields_set and getattr(self, name) is None]
        if nulls:
            raise ValueError(f"{', '.join(nulls)} cannot be null")
        return self

    def changes(self) -> UserChanges:
        """The store's partial update: the keys sent, without the password."""
        changes: UserChanges = {}
        sent = self.model_fields_set
        if self.username is not None:
            changes["username"] = self.username
        if self.role is not None:
            changes["role"] = self.role
        if "display_name" in sent:
            changes["display_name"] = self.display_name
        if "email" in sent:
            changes["email"] = self.email
        if "allowed_node_ids" in sent:
            ids = self.allowed_node_ids
            changes["allowed_node_ids"] = None if ids is None else tuple(ids)
        if self.is_temporary is not None:
            changes["is_temporary"] = self.is_temporary
        if "expires_at" in sent:
            changes["expires_at"] = self.expires_at
        if self.is_active is not None:
            changes["is_active"] = self.is_active
        return changes


_CREATE: Final = TypeAdapter(UserCreate)
_UPDATE: Final = TypeAdapter(UserUpdate)


def _user_id(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


def _not_found() -> errors.NotFound:
    return errors.NotFound("user not found")


@bp.get("/api/v1/users")
@require(Role.ADMIN)
async def list_users() -> Response:
    """Every user, a bare array."""
    return json_response([UserOut.from_record(user) for user in await service().list_users()])


@bp.post("/api/v1/users")
@require(Role.ADMIN)
async def create_user() -> Response:
    """Creates a user: 201 with its record; 409 for a taken username."""
    raw = await read_json_object()
    ManagerService.check_may_manage(current_principal(), None, raw.get("role"))
    body = validate(_CREATE, raw)
    created = await service().create_user(body.to_new_user(), body.password)
    return json_response(UserOut.from_record(created), 201)


@bp.get("/api/v1/users/<user_id>")
@require(Role.ADMIN)
async def get_user(user_id: str) -> Response:
    """One user's record."""
    uid = _user_id(user_id)
    found = None if uid is None else await service().find_user(uid)
    if found is None:
        raise _not_found()
    return json_response(UserOut.from_record(found))


@bp.put("/api/v1/users/<user_id>")
@require(Role.ADMIN)
async def update_user(user_id: str) -> Response:
    """A partial update; a new password or ``is_active: false`` also ends the user's sessions."""
    uid = _user_id(user_id)
    target = None if uid is None else await service().find_user(uid)
    raw = await read_json_object()
    ManagerService.check_may_manage(current_principal(), target, raw.get("role"))
    body = validate(_UPDATE, raw)
    if uid is None or target is None:
        raise _not_found()
    updated = await service().update_user(uid, body.changes(), body.password)
    return json_response(UserOut.from_record(updated))


@bp.delete("/api/v1/users/<user_id>")
@require(Role.ADMIN)
async def delete_user(user_id: str) -> Response:
    """Deletes the user and its sessions: 204."""
    uid = _user_id(user_id)
    target = None if uid is None else await service().find_user(uid)
    ManagerService.check_may_manage(current_principal(), target)
    if uid is None or target is None:
        raise _not_found()
    await service().delete_user(uid)
    return Response("", status=204)
