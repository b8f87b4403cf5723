"""The StableTrainingJob object as a whole: what kubectl applies and the operator reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from stabletrain_operator.api.base import ApiModel
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus


class StableTrainingJob(ApiModel):
    """A torchrun training job that rolls itself back from loss spikes and NaNs."""

    api_version: Literal["stabletrain.dev/v1alpha1"] = "stabletrain.dev/v1alpha1"
    kind: Literal["StableTrainingJob"] = "StableTrainingJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: StableTrainingJobSpec
    status: StableTrainingJobStatus = Field(default_factory=StableTrainingJobStatus)
