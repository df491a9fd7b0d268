"""NMOS on the edge (interop.md 5): IS-04 v1.3 Node API and registration, IS-05 v1.1 Connection API.

- ``ids``: the uuid5 ids of interop.md 5;
- ``tai``: resource versions (``<seconds>:<nanoseconds>`` of TAI);
- ``schemas``: the vendored AMWA schemas and a validator.
"""
