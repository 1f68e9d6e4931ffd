"""The HTTP surface: the middlewares (``middleware``: the request's record, its id,
counter and access log; authentication before the body and the body limit), who is
calling (``auth``, ``keys``), the routes (``routes``, ``admin``, ``admin_status``,
``pages``) and the OpenAPI document (``openapi``). May import every part below it:
the request path, telemetry, admission, the backends, the store, the records, the
errors and the configuration.
"""
