"""POLICY.yaml: the `detection` and `recovery` parts of a StableTrainingJob spec.

Validated by the same API models the operator uses, so a policy that replays cleanly is a
policy the cluster accepts; errors name the file and the field path as written in YAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from stabletrain_contract.base import error_lines
from stabletrain_contract.detection import DetectionConfig
from stabletrain_operator.api.spec import RecoverySpec
from stabletrain_operator.cli.errors import USAGE_EXIT, CliError

ALLOWED_KEYS = ("detection", "recovery")
Model = TypeVar("Model", DetectionConfig, RecoverySpec)


@dataclass(frozen=True)
class ReplayPolicy:
    detection: DetectionConfig
    recovery: RecoverySpec
    source: str
    """Where it came from, for the report: the file, or "the default policy"."""


def default_policy() -> ReplayPolicy:
    return ReplayPolicy(DetectionConfig(), RecoverySpec(), "the default policy")


def read_policy(path: Path) -> ReplayPolicy:
    """Load and validate `path`; CliError (exit 2) names the file and each bad field."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", exit_code=USAGE_EXIT) from None
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"{path}: cannot read: {error}", exit_code=USAGE_EXIT) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = "" if mark is None else f":{mark.line + 1}:{mark.column + 1}"
        problem = getattr(error, "problem", None) or str(error)
        raise CliError(f"{path}{where}: not valid YAML: {problem}", exit_code=USAGE_EXIT) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise CliError(
            f"{path}: expected a mapping with {' and/or '.join(ALLOWED_KEYS)}, "
            f"got {type(document).__name__}",
            exit_code=USAGE_EXIT,
        )
    unknown = sorted(str(key) for key in document if key not in ALLOWED_KEYS)
    if unknown:
        raise CliError(
            f"{path}: unknown top-level key(s) {', '.join(unknown)}; a policy file holds "
            f"only {' and '.join(ALLOWED_KEYS)} (the same fields as in a StableTrainingJob spec)",
            exit_code=USAGE_EXIT,
        )
    detection = _validate(path, DetectionConfig, "detection", document.get("detection"))
    recovery = _validate(path, RecoverySpec, "recovery", document.get("recovery"))
    _check_custom_signals(path, detection, recovery)
    return ReplayPolicy(detection, recovery, str(path))


def _validate(path: Path, model: type[Model], key: str, value: Any) -> Model:
    try:
        return model.model_validate({} if value is None else value)
    except ValidationError as error:
        problems = "\n".join(f"  {line}" for line in error_lines(error, under=key))
        raise CliError(f"{path}: invalid policy:\n{problems}", exit_code=USAGE_EXIT) from None


def _check_custom_signals(path: Path, detection: DetectionConfig, recovery: RecoverySpec) -> None:
    """The spec-level rule the CRD enforces with CEL: rules only name defined custom signals."""
    defined = detection.custom_signal_names()
    for index, rule in enumerate(recovery.rules):
        for field_name, signals in (
            ("onSignals", rule.on_signals),
            ("whileFiring", rule.while_firing),
        ):
            for signal in signals:
                if signal.startswith("custom:") and signal not in defined:
                    raise CliError(
                        f"{path}: invalid policy:\n  recovery.rules.{index}.{field_name}: "
                        f"{signal} is not defined in detection.custom",
                        exit_code=USAGE_EXIT,
                    )
