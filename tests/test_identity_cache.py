"""support/identity_cache.py: values built once per (object, key), per object identity, bounded."""

from __future__ import annotations

from shardplan.support.identity_cache import IdentityCache


class Frozen:  # like a frozen pydantic model with dict fields: equal by value, not hashable
    __hash__ = None

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Frozen) and other.value == self.value


def test_a_value_is_built_once_per_object_and_key():
    cache, built = IdentityCache(8), []
    one = Frozen(1)
    build = lambda: built.append(1) or len(built)  # noqa: E731
    assert cache.get(one, "a", build) == 1 and cache.get(one, "a", build) == 1
    assert cache.get(one, "b", build) == 2  # another key: built again
    assert cache.get(Frozen(1), "a", build) == 3  # an equal but different object is not the same entry
    assert len(built) == 3


def test_an_entry_holds_its_object_so_its_id_is_not_reused():
    cache = IdentityCache(8)
    cache.get(Frozen(5), None, lambda: "five")  # the only reference is the cache's
    later = Frozen(6)
    assert cache.get(later, None, lambda: "six") == "six"


def test_the_cache_is_bounded():
    cache = IdentityCache(4)
    objects = [Frozen(i) for i in range(10)]
    for i, obj in enumerate(objects):
        assert cache.get(obj, None, lambda i=i: i) == i
        assert len(cache) <= 4
    # cleared when full: an object asked about again after that is built again, with the same answer
    assert cache.get(objects[0], None, lambda: 0) == 0
