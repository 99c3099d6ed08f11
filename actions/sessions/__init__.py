"""Session write paths, one module per call of a session's life (``docs/sessions.md``)."""
