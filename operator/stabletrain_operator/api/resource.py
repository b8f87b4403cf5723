"""The StableTrainingJob object as a whole: what kubectl applies and the operator reads."""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from stabletrain_operator.api.base import ApiModel
from stabletrain_operator.api.constants import JOB_NAME_MAX
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus

JOB_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1035 label: the job's headless Service is named after the job (a dot, or a leading
digit, is a valid object name that no Service can have)."""
JOB_NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label of at most {JOB_NAME_MAX} characters (lowercase "
    "letters, digits and '-', starting with a letter): it names the job's Service and, with "
    "the attempt and the rank, every pod's hostname"
)


class StableTrainingJob(ApiModel):
    """A torchrun training job that rolls itself back from loss spikes and NaNs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # Only when the job is created: a job made before the rule existed keeps
                    # working (its status writes too), with the operator's own check of the
                    # name (tenancy/hostnames.py) before anything is created for it.
                    "rule": "oldSelf.hasValue()"
                    f" || (self.metadata.name.matches('{JOB_NAME_PATTERN}')"
                    f" && size(self.metadata.name) <= {JOB_NAME_MAX})",
                    "message": JOB_NAME_MESSAGE,
                    "optionalOldSelf": True,
                }
            ]
        }
    )

    api_version: Literal["stabletrain.dev/v1alpha1"] = "stabletrain.dev/v1alpha1"
    kind: Literal["StableTrainingJob"] = "StableTrainingJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: StableTrainingJobSpec
    status: StableTrainingJobStatus = Field(default_factory=StableTrainingJobStatus)

    @model_validator(mode="after")
    def _usable_name(self) -> Self:
        name = self.metadata.get("name")
        if name is not None and not (
            isinstance(name, str) and re.fullmatch(JOB_NAME_PATTERN, name)
            and len(name) <= JOB_NAME_MAX
        ):  # fmt: skip
            raise ValueError(JOB_NAME_MESSAGE)
        return self
