"""tokenpace gateway: the OpenAI-compatible front door.

Modules (docs/architecture/gateway.md, "The gateway's layout", says how they fit): ``app``
(``create_app``, the composition root), ``middleware``, ``auth``, ``routes``,
``completions`` (the completion request path) and ``disconnect``, ``openapi``,
``context`` (the typed per-request records), ``errors``, ``config`` (the schema) and
``config_loader`` (files, the demo default), ``schemas``, ``tiers``, ``tagging``,
``admission``, ``ratelimit``, ``routing``, ``dispatch`` (failover), ``streaming`` (the
SSE relay) and ``read_deadline``, ``interruptible`` (an await another party may
interrupt, for ``disconnect`` and ``read_deadline``), ``cancel_safe``, ``backends``
(``base``, ``http``, ``sse``, ``aggregate``, ``kinds``), ``upstream`` (the aiohttp
transport), ``embedded`` and ``embedded_text`` (the simulated engine), ``store`` (memory
or Redis), ``keys``, ``telemetry``, ``telemetry_token``, ``admin``, ``admin_status``,
``pages``, ``serveability``, ``server``, ``metrics``, ``logs`` and ``cli``. The wire
contract is docs/protocol.md. Importing this package imports nothing heavy.
"""
