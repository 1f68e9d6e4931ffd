"""The processes the gateway runs as: ``server`` (uvicorn with the connection limits),
``workers`` (``tokenpace serve --workers N``: uvicorn's supervisor, each worker a whole
gateway) and ``engine_server`` (in-process engines served once, over HTTP, to the
workers). May import the composition root (``gateway.app``) and everything below it.
"""
