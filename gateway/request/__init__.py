"""The completion request path: ``completions`` (the service: the body's checks in
``body``, the tier from ``tiers``, the model, admission, then the relay), ``disconnect``
(set-up cancelled when the client leaves) and ``schemas`` (the request and response
models). May import the relay, admission, telemetry, the backends, the store, the
records, the errors and the configuration.
"""
