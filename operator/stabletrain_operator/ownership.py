"""Whose an object is, by the UID of its controller, never by its name or labels.

Labels and names are anybody's to set in a namespace: a pod carrying a job's labels was
scraped, sent the job's bearer token and its termination message acted on; a create
answered 409 was taken as "made by an earlier tick"; a job deleted and recreated under the
same name adopted its predecessor's pods and Secret. The operator's objects carry an
ownerReference with `controller: true` and the job's UID (pods.JobRef.owner_reference), and
the operator acts only on objects whose controller reference carries the UID of the job at
hand. Setting that reference needs the job's UID and, with blockOwnerDeletion, the right to
delete the job (the OwnerReferencesPermissionEnforcement admission plugin).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stabletrain_operator.api.constants import GROUP, KIND, Reason
from stabletrain_operator.tenancy.problems import SpecProblem

Json = Mapping[str, Any]


def controller(metadata: Json) -> Json | None:
    """The object's controller reference, if a StableTrainingJob controls it."""
    for reference in metadata.get("ownerReferences") or []:
        if not isinstance(reference, Mapping) or not reference.get("controller"):
            continue
        group = str(reference.get("apiVersion") or "").split("/", 1)[0]
        if group == GROUP and reference.get("kind") == KIND:
            return reference
        return None
    return None


def controller_uid(metadata: Json) -> str | None:
    reference = controller(metadata)
    return None if reference is None else str(reference.get("uid") or "") or None


def owned_by(obj: Json, uid: str) -> bool:
    return controller_uid(obj.get("metadata") or {}) == uid


@dataclass(frozen=True)
class NotOwnedError(Exception):
    """An object the job needs exists under its name but another owner controls it."""

    kind: str
    name: str
    namespace: str
    owner: Json | None
    """The existing object's controller reference (None: not controlled by a job)."""
    job: str
    """The name of the job that wanted it."""

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}: {self._whose()}"

    def _whose(self) -> str:
        if self.owner is None:
            return "exists and is not controlled by a StableTrainingJob"
        return (
            f"exists and belongs to StableTrainingJob {self.owner.get('name')} "
            f"(uid {self.owner.get('uid')})"
        )

    @property
    def predecessor(self) -> bool:
        """Left by an earlier job of the same name, which garbage collection is removing."""
        return self.owner is not None and self.owner.get("name") == self.job

    def problem(self) -> SpecProblem:
        return SpecProblem(
            "metadata.name",
            Reason.NAME_TAKEN,
            f"{self.kind} {self.name} {self._whose()}; the job never uses another owner's "
            "object: delete it, or recreate the job under another name",
        )
