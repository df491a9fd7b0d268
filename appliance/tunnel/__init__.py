"""Edge↔edge tunnel cores (sans-IO): payload sealing and replay protection (interop.md 10)."""
