"""Worker and controller configuration, from the environment (see the README's reference).

Three groups, each read on its own so a process only validates what it uses:
- `Settings` (the worker and the controller): backends, task queues, limits, metrics and health;
- `CodecSettings`: the optional payload encryption, read by `connect()` in every process that talks
  to Temporal (worker, controller, CLI, codec server), since all of them must agree on it;
- `TEMPORAL_*` connection settings (address, namespace, TLS, mTLS, API key, profiles) are read by
  `temporalio.envconfig`, and tracing by the standard `OTEL_*` variables (see worker/telemetry.py).
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Sequence
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from activities.bmaas.client import PRIVATE_PREFIX
from activities.reporting import DEFAULT_BATCH_WINDOW_S
from contracts.refs import DNS_LABEL
from contracts.workflows import BMAAS_TASK_QUEUE, WORKFLOW_TASK_QUEUE
from worker.health import split_bind


class WorkerRole(StrEnum):
    """What one worker process polls for. `all` is one process; `workflows` and `activities` split
    the work over two kinds of process, scaled apart (see the README)."""

    ALL = "all"
    WORKFLOWS = "workflows"  # workflow tasks, and the local activities they run
    ACTIVITIES = "activities"  # the hub and BMaaS activity tasks


_DAY = 86400.0


class Settings(BaseSettings):
    """`TEMPORAL_*` connection settings are read by `temporalio.envconfig` (profiles, TLS, API key)."""

    # No inf or nan anywhere, and every duration bounded: timedelta() overflows on huge values, after
    # Temporal was connected, as a traceback.
    model_config = SettingsConfigDict(env_prefix="OSAC_", extra="ignore", allow_inf_nan=False)

    fulfillment_url: str = Field(
        default="http://127.0.0.1:8100",
        description="BMaaS root URL, without /api/private/v1 (the client adds it)",
    )
    fulfillment_token_file: Path = Field(
        default=Path("/var/run/secrets/osac/fulfillment-token"), description="bearer token, re-read on change"
    )
    fulfillment_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle to verify BMaaS with; certifi's (or SSL_CERT_FILE) when unset",
    )
    kubeconfig: Path | None = Field(
        default=None,
        validation_alias="KUBECONFIG",
        description="hub kubeconfig; the pod's service account when unset inside a cluster",
    )
    role: WorkerRole = Field(
        default=WorkerRole.ALL, validation_alias="OSAC_WORKER_ROLE", description="what this process polls for"
    )
    task_queue: str = WORKFLOW_TASK_QUEUE
    bmaas_task_queue: str = BMAAS_TASK_QUEUE
    # Upper bound on BMaaS activity starts per second across all workers of the task queue.
    bmaas_activities_per_second: float | None = Field(default=20.0, gt=0)
    # Most running activities are waits (a coroutine each on a shared watch), about one per worker
    # in flight: a low cap lets waits hold every slot while the short calls that make progress queue
    # behind them. The calls themselves are bounded by blocking_threads and the BMaaS start rate.
    max_concurrent_activities: int = Field(default=2000, gt=0)
    blocking_threads: int = Field(default=32, gt=0)
    # Workflows kept in memory between tasks. Ready workers wait for days without a task, so a
    # cache smaller than the workers held bounds memory; an evicted worker replays its short history
    # when its next event comes. 500 covers 500 workers in flight and halved their CPU; 1,000 Ready
    # workers still fit in 365 MB (bench/README.md round 4).
    max_cached_workflows: int = Field(default=500, ge=0)
    # Workflow tasks processed at once. They share one interpreter (the GIL): beyond a few, more only
    # makes each task slower, and a task over its 10 s timeout is thrown away and replayed.
    max_concurrent_workflow_tasks: int = Field(default=16, ge=2)
    # The SDK's 5 workflow-task pollers are kept: autoscaling up to 20 fetched the first tasks of a
    # burst of new workflows sooner; the running ones' tasks waited behind them (bench/README.md round 8).
    # How long a task for a cached workflow waits for this process before the server gives it to
    # any worker instead: a timeout adds two events and a full replay. 60 s removed every timeout
    # at 500 workers in flight. After a SIGKILL the server keeps using the dead process's queue for
    # a few seconds (until it sees nobody polls it): a task that lands there then waits this long.
    sticky_queue_timeout_seconds: float = Field(default=60.0, gt=0, le=_DAY)
    # How long a worker report waits for others to the same cluster workflow, so a burst of phase
    # changes reaches it in a few signals (each wakes it: history events). 0: send at once.
    report_batch_window_seconds: float = Field(default=DEFAULT_BATCH_WINDOW_S, ge=0, le=5)
    graceful_shutdown_seconds: float = Field(default=30.0, ge=0, le=_DAY)
    # The worker and the controller keep trying to reach Temporal this long at start (0: once).
    temporal_connect_seconds: float = Field(default=120.0, ge=0, le=_DAY)
    controller_namespaces: list[str] = Field(default_factory=list, description="empty: all namespaces")
    controller_resync_seconds: float = Field(default=300.0, gt=0, le=_DAY)
    metrics_bind: str | None = Field(
        default=None,
        description="host:port of the Prometheus endpoint (/metrics) of the Temporal runtime; off when unset",
    )
    health_bind: str | None = Field(
        default=None, description="host:port of the /healthz and /readyz probes; off when unset"
    )

    @field_validator("fulfillment_url")
    @classmethod
    def _root_url(cls, url: str) -> str:
        """Checked at start: without a scheme every call fails (httpx UnsupportedProtocol), and with
        the API path every call 404s (the client appends PRIVATE_PREFIX itself)."""
        if "@" in url:  # anywhere: a password holding '?' or '#' would hide it from urlsplit
            raise ValueError("credentials do not belong in the URL (the token comes from its own file)")
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port that is not a number, or out of range, raises ValueError
        except ValueError:
            # Not urlsplit's own words: they quote the part taken for a port.
            raise ValueError(
                "not a URL (its port is not a number from 0 to 65535, or its host is malformed)"
            ) from None
        if parts.scheme not in ("http", "https"):
            raise ValueError("expected an http:// or https:// URL, e.g. https://fulfillment.example.com")
        if not parts.hostname:
            raise ValueError("the URL has no host")
        if parts.query or parts.fragment:
            raise ValueError("the URL must not have a query or a fragment")
        # A path prefix of a proxy in front of BMaaS is fine; the API's own path is not.
        api_root = PRIVATE_PREFIX.rsplit("/", 1)[0]  # /api/private
        if f"{api_root}/" in f"{parts.path.rstrip('/')}/":
            raise ValueError(
                f"give the service's root URL, without {PRIVATE_PREFIX} (the client adds it to every call)"
            )
        return url

    @field_validator("fulfillment_ca_file")
    @classmethod
    def _ca_bundle(cls, path: Path | None) -> Path | None:
        """Read at start, with the variable named, not as a traceback when the first client is built."""
        if path is not None:
            try:
                ssl.create_default_context(cafile=str(path))
            except (OSError, ssl.SSLError) as err:
                raise ValueError(f"{path} is not a readable PEM CA bundle ({err.strerror or err})") from None
        return path

    @field_validator("controller_namespaces")
    @classmethod
    def _namespaces(cls, namespaces: list[str]) -> list[str]:
        """A name no namespace can have would filter every order out, silently."""
        wrong = [n for n in namespaces if not re.fullmatch(DNS_LABEL, n)]
        if wrong:
            raise ValueError(f"not a namespace name (a DNS label): {', '.join(map(repr, wrong))}")
        return namespaces

    @field_validator("metrics_bind", "health_bind")
    @classmethod
    def _host_and_port(cls, bind: str | None, info: ValidationInfo) -> str | None:
        """Checked at start, with the variable named, not once Temporal and the backends are up."""
        if bind:
            _, port = split_bind(bind)
            if port > 65535:
                raise ValueError(f"port {port} is above 65535")
            if info.field_name == "metrics_bind":
                # The Temporal runtime binds a socket address: an IP, not a host name.
                try:
                    ipaddress.ip_address(bind.rpartition(":")[0].strip("[]"))
                except ValueError:
                    raise ValueError(
                        f"expected ip:port (the runtime takes no host name), got {bind!r}"
                    ) from None
        return bind

    def workflow_worker_tuning(self) -> dict[str, Any]:
        """The capacity options of the worker that runs the workflows (`temporalio.worker.Worker`)."""
        return {
            "max_cached_workflows": self.max_cached_workflows,
            "max_concurrent_workflow_tasks": self.max_concurrent_workflow_tasks,
            "sticky_queue_schedule_to_start_timeout": timedelta(seconds=self.sticky_queue_timeout_seconds),
            "max_concurrent_activities": self.max_concurrent_activities,
        }


class CodecSettings(BaseSettings):
    """Optional AES-GCM payload encryption. Off unless keys are configured.

    Keys are `id=base64` entries (16, 24 or 32 bytes after decoding), separated by commas or newlines,
    from OSAC_CODEC_KEYS and/or the file OSAC_CODEC_KEYS_FILE. Every key decrypts; the one named by
    OSAC_CODEC_ENCODE_KEY (default: the first listed) encrypts.
    """

    model_config = SettingsConfigDict(env_prefix="OSAC_CODEC_", extra="ignore")

    keys: SecretStr | None = Field(default=None, description="inline key ring: id=base64[,id=base64...]")
    keys_file: Path | None = Field(default=None, description="file holding the key ring (a mounted Secret)")
    encode_key: str | None = Field(default=None, description="id of the key new payloads are encrypted with")
    # Read by `osac-workers codec serve` only; the other processes ignore it.
    server_auth_file: Path | None = Field(
        default=None,
        description="file holding the Authorization header value /encode and /decode require; re-read",
    )

    @property
    def enabled(self) -> bool:
        return bool((self.keys and self.keys.get_secret_value().strip()) or self.keys_file)


# --------------------------------------------------------------------------------- loading errors

S = TypeVar("S", bound=BaseSettings)


class ConfigError(ValueError):
    """Configuration that cannot be used: one line per problem, each naming its environment variable
    (the commands print them and exit 2, as the README promises)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def env_variable(cls: type[BaseSettings], field: str) -> str:
    """The environment variable a field of `cls` is read from (its alias, else prefix + name)."""
    info = cls.model_fields.get(field)
    if info is None:
        return field  # pydantic names an aliased field by its alias, which is the variable
    if isinstance(info.validation_alias, str):
        return info.validation_alias
    return f"{cls.model_config.get('env_prefix') or ''}{field}".upper()


def _secret(info: FieldInfo | None) -> bool:
    annotation = info.annotation if info is not None else None
    return annotation is SecretStr or SecretStr in get_args(annotation)


def _field_of(cls: type[BaseSettings], name: str) -> FieldInfo | None:
    found = cls.model_fields.get(name)
    if found is not None:
        return found
    return next((f for f in cls.model_fields.values() if f.validation_alias == name), None)


def _problem(cls: type[BaseSettings], error: ErrorDetails) -> str:
    first, *rest = error["loc"] or ("?",)
    where = env_variable(cls, str(first)) + "".join(f"[{part}]" for part in rest)
    value = error.get("input")
    plain = error["loc"] and isinstance(value, str | int | float) and not _secret(_field_of(cls, str(first)))
    shown = f" (got {value!r})" if plain and not _may_carry_credentials(value) else ""
    return f"{where}: {error['msg']}{shown}"


def _may_carry_credentials(value: object) -> bool:
    """A value with `user:password@` (with a scheme or without) or a query or fragment (a token
    passed as `?access_token=`) is never echoed back in an error."""
    return isinstance(value, str) and any(mark in value for mark in "@?#")


_SETTINGS_FIELD = re.compile(r'field "([^"]+)"')


def load_settings(cls: type[S]) -> S:
    """`cls()` from the environment, or a `ConfigError` naming each bad variable and why."""
    try:
        return cls()
    except ValidationError as err:
        raise ConfigError([_problem(cls, e) for e in err.errors()]) from None
    except SettingsError as err:
        # A list variable that is not JSON: pydantic-settings stops there, before validating the rest.
        match = _SETTINGS_FIELD.search(str(err))
        where = env_variable(cls, match.group(1)) if match else cls.__name__
        raise ConfigError([f"{where}: not valid JSON ({err.__cause__ or err})"]) from None
