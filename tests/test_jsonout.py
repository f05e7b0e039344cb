"""JSON written a piece at a time (ckptmerge.core.jsonout): the same text as writing it whole, lazy
containers made while written, strict numbers."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptmerge.core.jsonout import Entries, Records, json_pieces, materialize
from ckptmerge.planning.planner import SourceView, make_plan
from ckptmerge.planning.rules import Rules
from ckptmerge.core.specs import VariableInfo

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                     max_leaves=20)


def _whole(data, depth, expand):
    """The layout written whole (the CLI's before pieces): a reference to compare with."""
    if depth >= expand or not isinstance(data, (dict, list)) or not data:
        return json.dumps(data, allow_nan=False)
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(data, dict):
        items = [f"{inner}{json.dumps(str(k))}: {_whole(v, depth + 1, expand)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    return "[\n" + ",\n".join(f"{inner}{_whole(v, depth + 1, expand)}" for v in data) + f"\n{pad}]"


def _lazy(data):
    """``data`` with every list and dict turned into Records and Entries made on the fly."""
    if isinstance(data, list):
        return Records(_lazy(v) for v in data)
    if isinstance(data, dict):
        return Entries((k, _lazy(v)) for k, v in data.items())
    return data


@settings(max_examples=300, deadline=None)
@given(data=_JSON, expand=st.integers(0, 3))
def test_pieces_are_the_whole_text_and_lazy_containers_write_the_same(data, expand):
    text = "".join(json_pieces(data, expand=expand))
    assert text == _whole(data, 0, expand)
    assert "".join(json_pieces(_lazy(data), expand=expand)) == text
    assert materialize(_lazy(data)) == data
    assert json.loads(text) == data


def test_records_are_made_while_written_not_before():
    made = []

    def record(i):
        made.append(i)
        return {"i": i}

    pieces = json_pieces({"xs": Records(map(record, range(3)))}, expand=2)
    assert made == []
    first = next(pieces)
    assert first == "{\n" and made == []
    assert json.loads(first + "".join(pieces)) == {"xs": [{"i": 0}, {"i": 1}, {"i": 2}]}
    assert made == [0, 1, 2]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_numbers_json_cannot_hold_are_refused_at_every_depth(bad):
    for data in ({"a": bad}, {"a": Records([{"b": bad}])}, [Entries([("c", [bad])])]):
        for expand in (0, 1, 3):
            with pytest.raises(ValueError, match="Out of range float"):
                "".join(json_pieces(data, expand=expand))


def test_a_lazy_plan_dict_writes_the_same_json_as_the_plain_one():
    targets = [VariableInfo(f"c/l{i}/w", (2, i % 3), "float32") for i in range(40)] + [VariableInfo("c/x", (1,), "int32")]
    variables = {f"l{i}/w": VariableInfo(f"l{i}/w", (2, i % 3 if i % 7 else 5), "float32") for i in range(45)}
    plan = make_plan(targets, [SourceView("A", "<memory>", "", variables, Rules.from_options(map={"/": "c/"}))])
    assert plan.mismatched and plan.missing and plan.unused["A"]  # every part has items
    plain, lazy = plan.to_dict(), plan.to_dict(lazy=True)
    assert isinstance(lazy["assignments"], Entries) and isinstance(lazy["targets"], Records)
    for expand in (1, 2):  # (a lazy dict is written once: one per writing)
        lazy = plan.to_dict(lazy=True)
        assert "".join(json_pieces(lazy, expand=expand)) == "".join(json_pieces(plain, expand=expand))
    assert materialize(plan.to_dict(lazy=True)) == plain
