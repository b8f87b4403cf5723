"""StableTrainingPolicy: a platform team's defaults and limits for the jobs of namespaces.

Cluster-scoped, like Kueue's ClusterQueue and Kubeflow Trainer's ClusterTrainingRuntime, so
a tenant who may create jobs in a namespace cannot write it (creating cluster-scoped objects
is a cluster administrator's right), and the namespace a job runs in decides which policy
applies, never the job: a job cannot pick a laxer one. Namespaces are chosen by a label
selector, the way Kueue's ClusterQueue chooses them.

`defaults` has the shape of a job's `detection` and `recovery`: what a job in a selected
namespace inherits for every field it does not set. `limits` bound what a job may ask for;
a job that sets a value beyond one is refused (status says which limit), a value it
inherits is held to the limit.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import Action
from stabletrain_operator.api.base import ApiModel
from stabletrain_operator.api.spec import Floor, RecoverySpec

POLICY_KIND = "StableTrainingPolicy"
POLICY_LIST_KIND = "StableTrainingPolicyList"
POLICY_PLURAL = "stabletrainingpolicies"
POLICY_SINGULAR = "stabletrainingpolicy"
POLICY_SHORT_NAMES = ("stp",)


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class SelectorRequirement(ApiModel):
    """metav1.LabelSelectorRequirement."""

    key: str = Field(min_length=1, max_length=317)
    """The label's key."""
    operator: SelectorOperator
    """In, NotIn, Exists or DoesNotExist."""
    values: tuple[str, ...] = Field(default=(), max_length=64)
    """Non-empty for In and NotIn, empty for Exists and DoesNotExist."""


class NamespaceSelector(ApiModel):
    """metav1.LabelSelector over namespace labels; empty selects every namespace."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Labels the namespace must carry with these values."""
    match_expressions: tuple[SelectorRequirement, ...] = Field(default=(), max_length=16)
    """Requirements the namespace's labels must all meet."""


class PolicyDefaults(ApiModel):
    """What a job inherits for each field of its `detection` and `recovery` it leaves out.

    Same shape and meaning as the job's fields (docs/api.md); a list (`recovery.rules`,
    `detection.custom`) is inherited whole, never merged item by item.
    """

    detection: DetectionConfig | None = None
    recovery: RecoverySpec | None = None


class PolicyLimits(ApiModel):
    """Bounds on what a job's effective policy may be. A value the job sets beyond one is
    refused; a value it inherits (from a policy's defaults or the built-in default) is held
    to it."""

    max_rollbacks: int | None = Field(default=None, ge=0, le=1000)
    """recovery.budgets.maxRollbacks at most this."""
    max_restarts: int | None = Field(default=None, ge=0, le=1000)
    """recovery.budgets.maxRestarts at most this."""
    min_lr_floor: Floor | None = None
    """Every rule's rollback.lrFloor and reduceLR.lrFloor at least this: how far the
    operator may lower a job's LR on its own."""
    min_spike_ratio: float | None = Field(default=None, gt=1.0, le=1000.0)
    """detection.lossSpike.ratio and gradNormSpike.ratio at least this (a lower ratio trips
    on the noise of a healthy run and spends the cluster on rollbacks)."""
    min_spike_zscore: float | None = Field(default=None, gt=0.0, le=1000.0)
    """detection.lossSpike.zscore and gradNormSpike.zscore at least this."""
    allowed_actions: tuple[Action, ...] | None = Field(default=None, max_length=len(Action))
    """Actions the rules and escalation.finalAction may use; null allows every action."""


class StableTrainingPolicySpec(ApiModel):
    """Which namespaces' jobs this applies to, their defaults and their limits."""

    namespace_selector: NamespaceSelector | None = None
    """Namespaces whose jobs it applies to, by their labels (`kubernetes.io/metadata.name`
    names one); null or empty: every namespace."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """When several policies select a namespace, each default comes from the one with the
    highest priority that sets it (then the first by name); limits of all of them apply."""
    defaults: PolicyDefaults = Field(default_factory=PolicyDefaults)
    limits: PolicyLimits = Field(default_factory=PolicyLimits)


class StableTrainingPolicy(ApiModel):
    """Defaults and limits of the recovery policy for the jobs of the namespaces it selects."""

    api_version: Literal["stabletrain.dev/v1alpha1"] = "stabletrain.dev/v1alpha1"
    kind: Literal["StableTrainingPolicy"] = "StableTrainingPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: StableTrainingPolicySpec = Field(default_factory=StableTrainingPolicySpec)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))
