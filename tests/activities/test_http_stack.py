"""The HTTP stack under every backend client: no per-request import searches."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from httpcore._synchronization import current_async_library


class _Lookups:
    """A path finder that only counts the searches for one module name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == self.name:
            self.count += 1
        return None


async def test_httpcore_names_the_event_loop_without_searching_for_sniffio() -> None:
    # httpcore asks which event loop runs on every lock it creates (several per request); without
    # sniffio installed each ask was a failed import searching the whole path.
    lookups = _Lookups("sniffio")
    sys.meta_path.insert(0, lookups)
    try:
        for _ in range(3):
            assert current_async_library() == "asyncio"
    finally:
        sys.meta_path.remove(lookups)
    assert lookups.count == 0
