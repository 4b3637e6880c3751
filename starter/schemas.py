"""JSON Schemas of every workflow payload, in `schemas/`, for callers in other languages (e.g. Go).

    python -m starter.schemas           # regenerate schemas/
    python -m starter.schemas --check   # exit 1 when schemas/ is stale (tests run this)

Read from the workflow definitions themselves: each workflow's input and result, and the argument
and result of every update, signal and query, so a new handler or a changed model shows up here.
Payloads a caller sends (inputs, update and signal arguments) are in pydantic's validation mode
(what the worker accepts); results a caller reads are in serialization mode (what it produces).
On the wire every payload is one JSON document, encoding `json/plain`, with the field names (and
aliases, e.g. `WorkerStatus`'s camelCase) of these schemas; durations are ISO 8601 strings
(`PT30S`) or seconds, instants RFC 3339.

`contract.json` ties them together: workflow type, id template, task queue, handler names.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from temporalio.workflow import _Definition

from contracts.workflows import BMAAS_TASK_QUEUE, WORKFLOW_TASK_QUEUE
from workflows.cluster_workers import ClusterWorkersWorkflow
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES
from workflows.worker_node import WorkerNodeWorkflow

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
CONTRACT_FILE = "contract.json"
Mode = Literal["validation", "serialization"]

WORKFLOWS: dict[type, dict[str, str]] = {
    ClusterWorkersWorkflow: {
        "id": "cluster-workers/{namespace}/{order}",
        "task_queue": WORKFLOW_TASK_QUEUE,
        "start": (
            "update-with-start of set_node_sets, workflow id conflict policy USE_EXISTING, reuse policy"
            " REJECT_DUPLICATE (ALLOW_DUPLICATE only to start afresh after a completed run);"
            " expected_node_sets refused as NodeSetsSuperseded when the node sets changed"
        ),
    },
    WorkerNodeWorkflow: {
        "id": "worker/{namespace}/{order}/{order}-worker-{index}",
        "task_queue": WORKFLOW_TASK_QUEUE,
        "start": "child of ClusterWorkersWorkflow only",
    },
}


def _model(hint: Any) -> type[BaseModel] | None:
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint
    if hint is type(None):
        return None
    raise TypeError(f"workflow payloads must be pydantic models, got {hint!r}")


def _args(fn: Any) -> tuple[type[BaseModel] | None, type[BaseModel] | None]:
    """(argument model, result model) of a handler with at most one argument."""
    hints = typing.get_type_hints(fn)
    result = _model(hints.pop("return", type(None)))
    if len(hints) > 1:
        raise TypeError(f"{fn.__qualname__}: one argument at most (a single model) keeps the contract simple")
    arg = _model(next(iter(hints.values()))) if hints else None
    return arg, result


def generate() -> dict[str, str]:
    """File name -> content of everything in schemas/."""
    schemas: dict[str, dict[str, Any]] = {}

    def ref(model: type[BaseModel] | None, mode: Mode) -> str | None:
        if model is None:
            return None
        name = model.__name__ if mode == "validation" else f"{model.__name__}.result"
        schema = model.model_json_schema(mode=mode, by_alias=True)
        existing = schemas.setdefault(name, schema)
        assert existing == schema
        return f"{name}.json"

    contract: dict[str, Any] = {
        "encoding": "json/plain (one JSON document per payload; field names as in the schemas)",
        "namespace": "the worker's Temporal namespace (TEMPORAL_NAMESPACE)",
        "task_queues": {"workflows": WORKFLOW_TASK_QUEUE, "bmaas_activities": BMAAS_TASK_QUEUE},
        "search_attributes": {key.name: key.indexed_value_type.name for key in ALL_SEARCH_ATTRIBUTES},
        "workflows": {},
    }
    for cls, facts in WORKFLOWS.items():
        definition = _Definition.must_from_class(cls)
        run_arg, run_result = _args(definition.run_fn)
        entry: dict[str, Any] = {
            **facts,
            "input": ref(run_arg, "validation"),
            "result": ref(run_result, "serialization"),
            "updates": {},
            "signals": {},
            "queries": {},
        }
        for name, update in sorted(definition.updates.items()):
            arg, result = _args(update.fn)
            entry["updates"][name] = {"arg": ref(arg, "validation"), "result": ref(result, "serialization")}
        for name, signal in sorted(definition.signals.items()):
            if name is None:
                continue
            arg, _ = _args(signal.fn)
            entry["signals"][name] = {"arg": ref(arg, "validation")}
        for name, query in sorted(definition.queries.items()):
            if name is None:
                continue
            _, result = _args(query.fn)
            entry["queries"][name] = {"result": ref(result, "serialization")}
        contract["workflows"][definition.name] = entry

    files = {f"{name}.json": _dump(schema) for name, schema in sorted(schemas.items())}
    files[CONTRACT_FILE] = _dump(contract)
    return files


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """Files that differ from what would be generated (missing, changed or left over)."""
    wanted = generate()
    present = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    problems = [
        name
        for name, text in wanted.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    problems += sorted(present - set(wanted))
    return sorted(problems)


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    wanted = generate()
    for old in directory.glob("*.json"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        (directory / name).write_text(text)
    return sorted(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if schemas/ is stale")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR)
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.dir)
        if problems:
            print(
                f"stale in {args.dir}: {', '.join(problems)}; run: python -m starter.schemas", file=sys.stderr
            )
            return 1
        print(f"{args.dir} is up to date")
        return 0
    names = write(args.dir)
    print(f"wrote {len(names)} files to {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
