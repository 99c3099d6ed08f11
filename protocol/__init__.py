"""The QingLong worker wire protocol, shared by the headless agent and the control plane.

Pure Python: it imports no Django (the agent must not). Modules: ``errors`` (the error type and
the catalogue of codes, with what a worker does on each), ``messages`` (request and answer
bodies), ``strictjson`` (strict body parsing), ``capabilities`` (snapshot schema and canonical
form), ``signing`` (the RFC 9421 request signing profile), ``ids`` (UUIDv7), ``wire`` (paths and
limits). The protocol on one page: ``docs/protocol.md``.
"""
