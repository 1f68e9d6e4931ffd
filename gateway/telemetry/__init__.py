"""What the gateway observes and is told: ``reports`` (the clients' QoE reports, the
gateway's own QoE records, their summaries), ``tokens`` (the telemetry tokens that
authenticate a report without the API key), ``metrics`` (every Prometheus series) and
``logs`` (structured log lines carrying the request id). May import the store, the
backends' router (for its gauges), the records, the errors and the configuration.
"""
