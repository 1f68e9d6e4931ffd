"""tokenpace gateway: the OpenAI-compatible front door.

Modules: ``config`` (configuration models and loader), ``errors`` (OpenAI error bodies),
``schemas`` (request/response models), ``tiers`` (tier resolution), ``tagging`` (what a
backend receives), ``backends`` (the Backend seam, HTTP backends, routing), ``upstream``
(the aiohttp transport), ``dispatch`` (failover), ``streaming`` (the SSE relay),
``cancel_safe``, ``admission`` (rate limits, the fair-share queue), ``store`` (shared
state: memory or Redis), ``keys`` (the API key cache), ``ratelimit``, ``telemetry`` and
``telemetry_token`` (QoE reports), ``admin`` and ``admin_status``, ``pages`` (/demo,
/dashboard), ``embedded`` (the simulated engine), ``serveability`` (tiers a backend
cannot serve), ``server`` (uvicorn with the gateway's connection limits), ``metrics``,
``logs``, ``state``, ``app`` (``create_app``) and ``cli`` (``serve``, ``check-config``,
``hash-key``).
The wire contract is docs/protocol.md. Importing this package imports nothing heavy.
"""
