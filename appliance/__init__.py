"""The shared runtime every Mediaplane service imports."""

__version__ = "0.1.0"
