"""The admission rules a column at a time (`broken_rules`, what predictions of whole files use) against the
rules one configuration at a time (`broken_rule`, what the advisor and the twin's admission use)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from twin.domain import Rule, broken_rule, broken_rules
from twin.limits import STORE_INT_MAX

# Every order of the rules' tests: zero and negative counts, divisors and not, the store's largest integer.
EDGES = (-3, 0, 1, 2, 3, 4, 6, 8, 12, 16, STORE_INT_MAX)


def one_at_a_time(rows: list[tuple[int, int, int, int]]) -> list[str | None]:
    return [(rule.value if (rule := broken_rule(*row)) is not None else None) for row in rows]


def test_every_combination_of_edge_values_breaks_the_same_first_rule() -> None:
    rows = list(itertools.product(EDGES, repeat=4))
    columns = [np.array(column) for column in zip(*rows, strict=True)]
    assert broken_rules(*columns).tolist() == one_at_a_time(rows)
    # Each rule (and none) is among them: the comparison covers every branch.
    assert set(one_at_a_time(rows)) == {None, *(rule.value for rule in Rule)}


@given(
    st.lists(
        st.tuples(*(st.integers(-(2**31), STORE_INT_MAX) for _ in range(4)))
        | st.tuples(*(st.integers(0, 64) for _ in range(4))),
        max_size=50,
    )
)
def test_any_rows_break_the_same_first_rule(rows: list[tuple[int, int, int, int]]) -> None:
    columns = [np.array(column, dtype=np.int64) for column in zip(*rows, strict=True)] if rows else [[]] * 4
    assert broken_rules(*columns).tolist() == one_at_a_time(rows)
