"""The edge's local status page on the ``monitor`` listener (interop.md 2; docs/edge.md "Status page")."""
