"""Tests of the sans-IO RTSP client core (services/edge/core/rtsp)."""
