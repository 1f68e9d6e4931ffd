"""The client's version, as its telemetry reports it (``sdk.version``)."""

__version__ = "0.1.0"
