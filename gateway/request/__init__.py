"""The completion request path: ``completions`` (the service: the body's checks, the
tier, the model, admission, then the relay), ``tiers`` (which tier a request is served
under), ``disconnect`` (set-up cancelled when the client leaves) and ``schemas`` (the
request and response models). May import the relay, admission, telemetry, the backends,
the store, the records, the errors and the configuration.
"""
