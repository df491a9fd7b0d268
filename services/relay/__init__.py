"""mp-relay: the relay service (QUIC control plane and the native UDP plane, interop.md 8 and 9)."""
