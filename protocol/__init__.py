"""The QingLong worker wire protocol, shared by the headless agent and the control plane.

Pure Python: it imports no Django (the agent must not). Modules: ``strictjson`` (strict body
parsing), ``capabilities`` (snapshot schema and canonical form), ``signing`` (the RFC 9421 request
signing profile), ``ids`` (UUIDv7), ``wire`` (paths and limits).
"""
