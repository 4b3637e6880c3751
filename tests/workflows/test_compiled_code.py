"""The sandbox's per-instance imports of workflow modules reuse one compilation (worker/compiled_code.py)."""

from __future__ import annotations

import sys
from collections import Counter
from importlib.machinery import SourceFileLoader

import pytest
from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from worker.compiled_code import _CompiledOnceFinder, compile_once
from workflows.worker_node import WorkerNodeWorkflow


async def test_the_sandbox_compiles_a_workflow_module_once_however_often_it_imports_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: Counter[str] = Counter()
    load = SourceFileLoader.get_code

    def counting(self: SourceFileLoader, fullname: str) -> object:
        loads[fullname] += 1
        return load(self, fullname)

    monkeypatch.setattr(SourceFileLoader, "get_code", counting)
    without_hook = [f for f in sys.meta_path if not isinstance(f, _CompiledOnceFinder)]
    monkeypatch.setattr(sys, "meta_path", without_hook)
    runner = SandboxedWorkflowRunner()
    definition = workflow._Definition.from_class(WorkerNodeWorkflow)
    assert definition is not None

    # Without it, every new workflow instance loads (without bytecode files: compiles) the module.
    runner.prepare_workflow(definition)
    runner.prepare_workflow(definition)
    assert loads["workflows.worker_node"] == 2

    compile_once()
    runner.prepare_workflow(definition)  # the first load through the hook (if no earlier test did)
    loads.clear()
    for _ in range(3):
        runner.prepare_workflow(definition)
    assert loads["workflows.worker_node"] == 0
    assert loads["workflows.activity_calls"] == 0
