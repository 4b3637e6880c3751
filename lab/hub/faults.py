"""API fault injection (`/lab/v1/faults/api`): error answers on chosen verbs/resources at a rate, and
watch streams cut now, at a rate per event, or after N events. One seeded RNG makes runs repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from lab.hub import errors
from lab.hub.errors import ApiError
from lab.hub.resources import ResourceType
from lab.hub.stats import Verb


class FaultCode(IntEnum):
    INTERNAL_ERROR = 500
    CONFLICT = 409
    UNAUTHORIZED = 401  # the token refused (a rotation the client has not followed)
    FORBIDDEN = 403  # a permission missing (a role a rollout forgot)
    NOT_FOUND = 404  # a plain-text page, no Status: a proxy's, or a path the hub does not serve
    EMPTY_OK = 200  # 200 with an empty body: a proxy or a gateway that cut the answer short


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _selects(values: Sequence[str], value: str) -> bool:
    return not values or value in values


def _selects_resource(resources: list[str], rt: ResourceType, subresource: str) -> bool:
    if not resources:
        return True
    names = {rt.plural, rt.group_resource}
    if subresource:
        names |= {f"{n}/{subresource}" for n in list(names)}
    return bool(names & set(resources))


class ErrorRule(_Model):
    code: FaultCode = FaultCode.INTERNAL_ERROR
    verbs: list[Verb] = []  # empty: every verb
    # `agents`, `agents.agent-install.openshift.io` or `clusterorders/status`; empty: every resource
    resources: list[str] = []
    users: list[str] = []  # empty: every user
    rate: float = Field(default=1.0, ge=0.0, le=1.0)
    limit: int | None = Field(default=None, ge=0)  # stop after injecting this many

    @model_validator(mode="after")
    def _empty_answers_only_to_reads(self) -> ErrorRule:
        # A proxy cuts an answer short after the hub acted; a write refused before it acts, with a
        # 200, would tell the client a change happened that did not.
        if self.code is FaultCode.EMPTY_OK and not (self.verbs and set(self.verbs) <= {Verb.GET, Verb.LIST}):
            raise ValueError("code 200 (an empty answer) is for verbs get and list only")
        return self


class WatchFaults(_Model):
    close_rate: float = Field(
        default=0.0, ge=0.0, le=1.0
    )  # chance, per event sent, to cut the stream after it
    close_after_events: int | None = Field(default=None, ge=1)  # cut every stream after this many events
    resources: list[str] = []
    users: list[str] = []


class ApiFaultConfig(_Model):
    seed: int = 0
    errors: list[ErrorRule] = []
    watch: WatchFaults = WatchFaults()
    close_watches_now: bool = False  # PUT-only action: close every open watch stream once


class ApiFaultStatus(_Model):
    config: ApiFaultConfig
    injected_errors: list[int]  # per rule, in order
    watches_cut: int
    open_watches: int


class ApiFaults:
    def __init__(self, seed: int = 0) -> None:
        self.config = ApiFaultConfig(seed=seed)
        self._rng = random.Random(seed)
        self.injected: list[int] = []
        self.watches_cut = 0

    def configure(self, config: ApiFaultConfig) -> None:
        self.config = config.model_copy(update={"close_watches_now": False})
        self._rng = random.Random(config.seed)
        self.injected = [0] * len(config.errors)
        self.watches_cut = 0

    def reset(self) -> None:
        self.configure(ApiFaultConfig(seed=self.config.seed))

    def check(self, user: str, verb: Verb, rt: ResourceType, subresource: str, name: str) -> None:
        """Raise the configured error if a rule fires for this request."""
        for index, rule in enumerate(self.config.errors):
            if not (_selects(rule.verbs, verb) and _selects(rule.users, user)):
                continue
            if not _selects_resource(rule.resources, rt, subresource):
                continue
            if rule.limit is not None and self.injected[index] >= rule.limit:
                continue
            if rule.rate < 1.0 and self._rng.random() >= rule.rate:
                continue
            self.injected[index] += 1
            raise self._error(rule.code, rt, name)

    @staticmethod
    def _error(code: FaultCode, rt: ResourceType, name: str) -> ApiError:
        if code is FaultCode.CONFLICT:
            return errors.conflict(rt.plural, rt.group, name)
        if code is FaultCode.UNAUTHORIZED:
            return errors.unauthorized()
        if code is FaultCode.FORBIDDEN:
            return errors.forbidden(rt.plural, rt.group, name, "injected fault (lab API faults)")
        if code is FaultCode.NOT_FOUND:
            return errors.page_not_found()
        if code is FaultCode.EMPTY_OK:
            return errors.empty_answer()
        return errors.internal_error("Internal error occurred: injected fault (lab API faults)")

    def cut_watch(self, user: str, rt: ResourceType, events_sent: int) -> bool:
        """Decide, after an event was sent on a stream, whether to end that stream now."""
        watch = self.config.watch
        if not (_selects(watch.users, user) and _selects_resource(watch.resources, rt, "")):
            return False
        cut = (watch.close_after_events is not None and events_sent >= watch.close_after_events) or (
            watch.close_rate > 0 and self._rng.random() < watch.close_rate
        )
        if cut:
            self.watches_cut += 1
        return cut
