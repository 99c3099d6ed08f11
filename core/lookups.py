"""Query vocabulary the models' constraints use (docs/performance.md, "CHECK constraints read as
one constant").

PostgreSQL prepares every CHECK constraint of a table again for each statement that writes it:
it reads the stored expression back from its text form and simplifies it before the first row.
``state IN ('a', 'b', …)`` is stored as an array built from one cast constant per value, so each
write statement pays for parsing, casting and folding every value of every state list again;
``state = ANY ('{a,b,…}'::text[])`` is stored as one constant and costs almost nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core.exceptions import EmptyResultSet
from django.db.models import F
from django.db.models.lookups import In


class OneOf(In):
    """``lhs`` is one of ``rhs``: ``IN (…)`` on SQLite, ``lhs::text = ANY('{…}'::text[])`` on
    PostgreSQL. For CHECK constraints over text columns (:func:`one_of`); ``rhs``: a list of str.
    """

    lookup_name = "one_of"

    def as_postgresql(self, compiler, connection) -> tuple[str, list]:
        values = [str(value) for value in self.rhs if value is not None]
        if not values:
            raise EmptyResultSet  # as In does: nothing is one of no values
        lhs, lhs_params = self.process_lhs(compiler, connection)
        return f"({lhs})::text = ANY(%s::text[])", [*lhs_params, values]


def one_of(field: str, values: Iterable[str]) -> OneOf:
    """The condition "``field`` holds one of ``values``", for a ``CheckConstraint``'s ``condition``
    (negate it with ``~``, combine it with ``Q`` by ``|`` and ``&``). ``values``: str, in order."""
    return OneOf(F(field), [str(value) for value in values])
