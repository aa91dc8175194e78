"""Root pytest hooks: they see the package's doctests (``--doctest-modules`` over ``lightning_speedups/``) too."""

from __future__ import annotations

import pytest

# doctests whose fix waits on the file's owner. Strict: once the example is fixed it XPASSes, which fails, and the
# entry has to go.
_PENDING_DOCTESTS: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = _PENDING_DOCTESTS.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
