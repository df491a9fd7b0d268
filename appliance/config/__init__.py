"""Edge persistence: atomic writes, config.json + encrypted secrets.json (interop.md 1.1, 2.7, 2.8)."""

from appliance.config.atomic import atomic_write
from appliance.config.store import (
    EdgeConfigStore,
    ensure_jwt_secret,
    fill_kept_secrets,
    merge_kept_secrets,
    public_config,
)

__all__ = [
    "EdgeConfigStore",
    "atomic_write",
    "ensure_jwt_secret",
    "fill_kept_secrets",
    "merge_kept_secrets",
    "public_config",
]
