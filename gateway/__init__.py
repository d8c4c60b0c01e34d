"""surogate.gateway: the OpenAI- and Anthropic-compatible HTTP edge of a Surogate server.

``GatewayApp(models, config)`` is an ASGI application (no web framework); ``server.serve``
runs it with granian. Wire types are msgspec Structs per API (``openai/``, ``anthropic/``),
errors are rendered in each API's envelope (``errors.py``), and generation goes through
``surogate.serve.LLM``, the generation API every caller shares (``serving.start``). Importing
this package loads no granian and starts no engine.
"""
