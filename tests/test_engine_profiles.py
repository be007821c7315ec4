"""The shared profile names and checks every engine store's ``profile=`` goes through."""

import pytest

from uibk_embedding.adapters.engine_profiles import PROFILE_NAMES, check_profile, profile_conflict
from uibk_embedding.adapters.exact import PROFILES


def test_names_are_the_exact_stores():
    """The engines take the exact store's names, no others (the CLI's --profile choices)."""
    assert PROFILE_NAMES == tuple(PROFILES)


def test_check_profile_refuses_by_name():
    supported = {"exact": "float32", "int8": "scalar int8"}
    assert check_profile("int8", supported, "qdrant") == "int8"
    assert check_profile(None, supported, "qdrant") is None
    with pytest.raises(ValueError, match=r"'compact' has no meaning on qdrant; it takes 'exact' \(float32\)"):
        check_profile("compact", supported, "qdrant")
    with pytest.raises(ValueError, match=r"profile must be one of 'exact'.*got 'int4'"):
        check_profile("int4", supported, "qdrant")


def test_profile_conflict_names_both():
    msg = profile_conflict("float16", "int8", "Qdrant collection 'd'")
    assert msg is not None and "profile='float16', not 'int8'" in msg and "Qdrant collection 'd'" in msg
    assert profile_conflict("float16", None, "x") is None
    assert profile_conflict("int8", "int8", "x") is None
    assert profile_conflict(None, "exact", "x") is not None
