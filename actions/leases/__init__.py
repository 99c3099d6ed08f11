"""Run lease write paths, one module per step of a lease's life (``docs/leases.md``)."""
