"""harness.overrides: every value parses back through Hydra's own override parser to the same value and type."""
import math

import pytest

from harness.overrides import OverrideValueError, hydra_value, parse_value

VALUES = [None, True, False, 0, -3, 7, 2.0, -0.5, 1e-05, 3e8, "tis", "moe_tiny", "/abs/path.yaml", "a-b",
          # strings Hydra would read as another type or split: they must come back as strings
          "true", "False", "null", "none", "inf", "-inf", "nan", "1", "2.5", "1e-3", "0.5_5.0", "",
          "a b", "a,b", "a=b", "a:b", "[x]", "{y}", "x'y", 'q"z', "back\\slash", "end\\", 'a\\"b', "$x", "*",
          [1, "true", 2.5, None], [], {"a": 1, "b": "c d"}, [[1, 2], {"k": "v"}]]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_keeps_value_and_type(value):
    back = parse_value(hydra_value(value))
    assert back == value and type(back) is type(value)


def test_non_finite_floats():
    assert parse_value(hydra_value(math.inf)) == math.inf and parse_value(hydra_value(-math.inf)) == -math.inf
    assert math.isnan(parse_value(hydra_value(math.nan)))


def test_no_form_is_an_error():
    with pytest.raises(OverrideValueError):
        hydra_value(object())
    with pytest.raises(OverrideValueError):
        hydra_value({"a b": 1})
