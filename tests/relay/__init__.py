"""Tests of the relay service."""
