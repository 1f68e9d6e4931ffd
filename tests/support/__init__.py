"""What the tests share (no tests here): the gateway and its stand-in upstream, servers
and processes, Redis, the SDK's and vLLM's harnesses, hand-built policy tables."""
