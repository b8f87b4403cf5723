"""The cluster's StableTrainingPolicy objects and the labels of the jobs' namespaces, as the
operator knows them: one list of policies every REFRESH_SECONDS shared by every job's
daemon, and each namespace's labels read at most every LABELS_SECONDS.

Not a kopf index: kopf holds every handler until each index has been filled once, so a
cluster without the policy CRD, or an install whose RBAC leaves it out, would serve no job
at all. Here such a cluster has no policy, and the operator says so in its log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any, Protocol

from pydantic import ValidationError

from stabletrain_operator.api.cluster_policy import StableTrainingPolicy
from stabletrain_operator.apiserver import ApiError
from stabletrain_operator.platform_policy.label_selection import applicable

REFRESH_SECONDS = 5.0
"""How long a policy edit takes at most to reach the jobs (plus their next tick)."""
LABELS_SECONDS = 30.0
"""How long a namespace's labels are used before they are read again."""

_log = logging.getLogger(__name__)


class PolicyReader(Protocol):
    """The two reads the catalog makes (kube.Kube)."""

    def list_policies(self) -> list[dict[str, Any]]: ...

    def namespace_labels(self, name: str) -> dict[str, str] | None: ...


class PolicyCatalog:
    """The policies and namespace labels every job's effective policy is computed from."""

    def __init__(self, reader: PolicyReader) -> None:
        self._reader = reader
        self.policies: tuple[StableTrainingPolicy, ...] = ()
        self.revision = 0
        """Grows whenever the policies or a namespace's labels change (jobs recompute)."""
        self.changes = 0
        """Grows when the policies or the labels of a namespace read before change: what
        wakes the jobs (a namespace's first read concerns only the job that made it)."""
        self._labels: dict[str, tuple[float, dict[str, str]]] = {}
        self._warned: set[str] = set()

    def refresh(self) -> None:
        """List the policies once (blocking: run it in a thread)."""
        try:
            listed = self._reader.list_policies()
        except ApiError as error:
            if error.status in (HTTPStatus.NOT_FOUND, HTTPStatus.FORBIDDEN):
                self._warn_once(
                    f"list-{error.status}",
                    f"StableTrainingPolicy objects cannot be listed ({error.status} "
                    f"{error.reason}): no platform policy applies to any job; install the "
                    "chart's CRD (crds/stabletrainingpolicies.yaml) and its RBAC",
                )
                self._replace(())
                return
            raise
        parsed: list[StableTrainingPolicy] = []
        for item in listed:
            try:
                parsed.append(StableTrainingPolicy.model_validate(item))
            except ValidationError as error:
                name = (item.get("metadata") or {}).get("name", "?")
                _log.error("StableTrainingPolicy %s is not what this operator reads; it is "
                           "left out: %s", name, error)  # fmt: skip
        self._replace(tuple(sorted(parsed, key=lambda p: p.name)))

    def _replace(self, policies: tuple[StableTrainingPolicy, ...]) -> None:
        if policies != self.policies:
            self.policies = policies
            self.revision += 1
            self.changes += 1

    async def follow(self, changed: Callable[[], None] = lambda: None) -> None:
        """Refresh every REFRESH_SECONDS until cancelled; an API error waits for the next.
        `changed` is called (in the event loop) after a refresh when `changes` moved since the
        last call, by a policy or by a namespace's labels a tick read: a job that waits for a
        change (finished, suspended) has no round to pick it up."""
        seen = self.changes
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await asyncio.to_thread(self.refresh)
            except ApiError as error:
                _log.warning("StableTrainingPolicy objects not listed (%s %s); the last "
                             "list stays in use", error.status, error.reason)  # fmt: skip
            if self.changes != seen:
                seen = self.changes
                changed()

    def labels_due(self, namespace: str) -> bool:
        known = self._labels.get(namespace)
        return known is None or time.monotonic() - known[0] >= LABELS_SECONDS

    def read_labels(self, namespace: str) -> None:
        """Read the namespace's labels (blocking: run it in a thread)."""
        try:
            labels = self._reader.namespace_labels(namespace)
        except ApiError as error:
            if error.status != HTTPStatus.FORBIDDEN:
                raise
            self._warn_once(
                "namespaces-403",
                "namespaces cannot be read (403): only StableTrainingPolicy objects without "
                "a namespaceSelector apply; grant get on namespaces (the chart does)",
            )
            labels = None
        known = self._labels.get(namespace)
        current = labels or {}
        if known is None or known[1] != current:
            self.revision += 1
        if known is not None and known[1] != current:
            self.changes += 1
        self._labels[namespace] = (time.monotonic(), current)

    def applying_to(self, namespace: str) -> tuple[StableTrainingPolicy, ...]:
        """The policies selecting the namespace, highest priority first."""
        known = self._labels.get(namespace)
        labels: Mapping[str, str] = known[1] if known is not None else {}
        return applicable(self.policies, labels)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning(message)
