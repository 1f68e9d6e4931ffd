"""The configuration: ``schema`` (the pydantic models, tier defaults, key digests) and
``loader`` (a YAML or TOML file read into them, every error naming its key; the demo
configuration). Imports nothing else of the gateway: every other part may import it.
"""
