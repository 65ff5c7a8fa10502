"""The runtime's memos (core/bounded.py) hold at most their bound: full, a new key empties them first."""

from tritongrad.core.bounded import Bounded


def test_a_full_memo_forgets_before_taking_a_new_key_and_keeps_updating_old_ones():
    memo = Bounded(3)
    for k in "abc":
        memo[k] = k.upper()
    memo["b"] = "B2"  # an update: nothing forgotten
    assert memo == {"a": "A", "b": "B2", "c": "C"}
    memo.add("d")  # a new key: the memo starts again
    assert memo == {"d": True} and "d" in memo and len(memo) <= memo.limit
