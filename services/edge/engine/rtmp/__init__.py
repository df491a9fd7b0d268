"""The RTMP(S) listener of the rtmp input kind (trio; the protocol is services/edge/core/rtmp)."""
