"""Settings read from environment variables: checked where they are read, one line naming the
variable, never passed on to an int() elsewhere nor silently replaced by a default."""

import pytest

from electra_jax.store import environment, gcs_lock
from electra_jax.store.environment import EnvironmentValueError


@pytest.mark.parametrize("value, expected", [("", None), ("0", 0), (" 12 ", 12)])
def test_a_whole_number_or_nothing(monkeypatch, value, expected):
    monkeypatch.setenv("SOME_COUNT", value)
    assert environment.whole_number("SOME_COUNT", "a count") == expected
    monkeypatch.delenv("SOME_COUNT")
    assert environment.whole_number("SOME_COUNT", "a count") is None


@pytest.mark.parametrize("value", ["abc", "1.5", "-1", "²", "0x10", "1e3"])
def test_anything_else_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("SOME_COUNT", value)
    with pytest.raises(EnvironmentValueError) as e:
        environment.whole_number("SOME_COUNT", "a count", minimum=0)
    assert f"environment variable SOME_COUNT={value!r} is not a whole number >= 0" in str(e.value)
    assert "(a count); set it right or unset it" in str(e.value)


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan", "1e300"])
def test_the_locks_lease_is_no_longer_replaced_by_the_default_without_a_word(monkeypatch, value):
    monkeypatch.setenv(gcs_lock.LEASE_ENV, value)
    with pytest.raises(EnvironmentValueError, match="ELECTRA_JAX_LOCK_LEASE_SECONDS="):
        gcs_lock.lease_seconds()
    monkeypatch.setenv(gcs_lock.LEASE_ENV, "90")
    assert gcs_lock.lease_seconds() == 90.0
    monkeypatch.delenv(gcs_lock.LEASE_ENV)
    assert gcs_lock.lease_seconds() == gcs_lock.DEFAULT_LEASE_SECONDS


def test_a_lock_object_with_a_lease_longer_than_a_day_is_not_taken_for_ours():
    """1e300 is finite JSON, and held the workdir for ever as a live run's lock; now it is named
    as another program's object, with the way to free it (ForeignLock's message)."""
    record = {"command": "x", "host": "h", "pid": 3}
    assert gcs_lock.record_problem({**record, "lease_seconds": 60}) is None
    assert gcs_lock.record_problem({**record, "lease_seconds": 1e300}) == (
        "its lease_seconds is 1e+300, longer than any run's lease (at most 86400 s): it would "
        "hold the workdir for ever"
    )
