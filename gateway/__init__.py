"""tokenpace gateway: the OpenAI-compatible front door (issue 3).

Modules: ``config`` (configuration models and loader), ``errors`` (OpenAI error bodies),
``schemas`` (request/response models), ``tiers`` (tier resolution), ``tagging`` (what a
backend receives), ``backends`` (the Backend seam, HTTP backends, routing), ``dispatch``
(failover), ``streaming`` (the SSE relay), ``metrics``, ``logs``, ``state``, ``app``
(``create_app``) and ``cli`` (``serve``, ``check-config``, ``hash-key``).
The wire contract is docs/protocol.md. Importing this package imports nothing heavy.
"""
