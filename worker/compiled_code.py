"""Workflow code compiled once per worker process.

The workflow sandbox imports a workflow's modules afresh for every workflow instance it creates, and
a worker holding more workflows than its cache recreates instances all the time. Without bytecode
files next to the source (an editable install, or `PYTHONDONTWRITEBYTECODE=1` as many container
images set) each of those imports compiles the source again: a fifth of the worker's CPU in a burst
of 1,000 workers. Code objects are immutable, so one compilation serves every sandbox. It also pins
the code a worker runs to what it loaded first: a file changed under a running worker cannot give
its workflows a second, different definition.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

_codes: dict[str, CodeType] = {}


class _CompiledOnceLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str) -> CodeType:
        code = _codes.get(self.path)
        if code is None:
            compiled = super().get_code(fullname)
            assert compiled is not None  # a source file always compiles to code (or raises)
            code = _codes[self.path] = compiled
        return code


class _CompiledOnceFinder(importlib.abc.MetaPathFinder):
    def __init__(self, packages: frozenset[str]) -> None:
        self.packages = packages

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.packages:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _CompiledOnceLoader(fullname, spec.loader.path)
        return spec


def compile_once(packages: Sequence[str] = ("workflows",)) -> None:
    """Serve the modules of `packages` from code compiled once in this process (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, _CompiledOnceFinder):
            finder.packages = finder.packages | frozenset(packages)
            return
    sys.meta_path.insert(0, _CompiledOnceFinder(frozenset(packages)))
