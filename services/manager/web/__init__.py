"""The manager's browser dashboard (issue 21): server-rendered pages, a client of ``/api/v1``.

Theory of operation
-------------------
Each page is a Jinja2 template rendered by the manager (``pages.py``) around the signed-in
user: the server decides what the page *shows* (a viewer gets no buttons it cannot use, an
operator no admin pages), and the page's own script (``static/pages/<page>.js``) reads and
changes state only through the REST routes of ``services/manager/api`` and the push stream
``/ws/dashboard`` (interop.md 6, 7), with the same session cookie and ``X-CSRF-Token`` header
any client sends. There is no second code path: every rule (roles, node access, validation,
CSRF) is the API's, so a refused button is refused by the server whatever the page shows.

Scripts are the project's own plain files plus uPlot, vendored from npm by ``make vendor``
(``tools/npm-assets.json`` pins its version and SHA-256; no CDN, no bundler); the pages run
under a strict Content-Security-Policy (``script-src 'self'``, nothing inline).
"""

from __future__ import annotations

from services.manager.web.pages import bp, register_web, vendor_dir

__all__ = ["bp", "register_web", "vendor_dir"]
