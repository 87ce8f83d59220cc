"""Places shared between namespaces: max-min fair, capped per namespace, alike everywhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from subres.sessions.fairness import share


def test_one_namespace_with_many_cannot_take_every_place() -> None:
    candidates = {"big": [f"b{i}" for i in range(40)], "a": ["a0", "a1"], "c": ["c0"]}
    chosen = share(candidates, total=10, per_namespace=100)
    assert chosen == {"a": ["a0", "a1"], "c": ["c0"], "big": [f"b{i}" for i in range(7)]}
    capped = share(candidates, total=100, per_namespace=5)
    assert {ns: len(items) for ns, items in capped.items()} == {"big": 5, "a": 2, "c": 1}


@given(
    st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(0, 30), max_size=8),
    st.integers(0, 60),
    st.integers(1, 20),
)
def test_shares_are_fair_and_bounded(sizes: dict[str, int], total: int, cap: int) -> None:
    candidates = {ns: [f"{ns}-{i}" for i in range(n)] for ns, n in sizes.items()}
    chosen = share(candidates, total=total, per_namespace=cap)
    counts = {ns: len(chosen.get(ns, [])) for ns in candidates}
    assert sum(counts.values()) == min(total, sum(min(n, cap) for n in sizes.values()))
    for ns, count in counts.items():
        assert count <= min(sizes[ns], cap)
        assert chosen.get(ns, []) == candidates[ns][:count]  # each namespace's own order
        if count < min(sizes[ns], cap):
            # Short of what it asked: nobody else got more than one place more.
            assert all(other <= count + 1 for other in counts.values())
