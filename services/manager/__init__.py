"""``mp-manager``: the Mediaplane fleet manager (shared/spec/manager-http-interface.md).

Today: the process skeleton (``cli.py`` serve and ``--version``, ``main.py`` start-up and
serving, ``tls.py`` the certificate, ``app.py`` the HTTP app with ``GET /health``) and the
secrets-at-rest helper (``secrets.py``). The store (``store/``) and the routes come next.
"""
