"""The manager's ``/api/v1`` routes: parse, authorise, call the service, answer (style.md H8).

``register_api`` adds the blueprints and the guard of ``auth_routes`` that checks, before a
request body is read, what a route declared with ``@require(role)`` (interop.md 13 order:
401 → 403 CSRF → 403 role → 413 → 400 → 404).
"""

from __future__ import annotations

from quart_trio import QuartTrio

from services.manager.api import ai, auth_routes, dashboard_ws, events, export, nodes, settings, tunnels, users

__all__ = ["register_api"]


def register_api(app: QuartTrio) -> None:
    """Registers the API blueprints on ``app`` and puts the auth guard before the body is read."""
    app.register_blueprint(auth_routes.bp)
    app.register_blueprint(users.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(settings.bp)
    app.register_blueprint(export.bp)
    app.register_blueprint(ai.bp)
    app.register_blueprint(nodes.bp)
    app.register_blueprint(tunnels.bp)  # POST /api/v1/tunnels: the manager pairs a tunnel
    app.register_blueprint(dashboard_ws.bp)  # /ws/dashboard (its own session check, before the upgrade)
    # The guard runs first: the shared bootstrap's body reader (which answers 413) comes after.
    app.before_request_funcs.setdefault(None, []).insert(0, auth_routes.guard_request)
