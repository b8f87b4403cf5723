"""The generated CRD against a real kube-apiserver: it installs, refuses malformed objects
with the field named, fills in the documented defaults, and shows the printer columns.

kubectl `apply` sends strict field validation by default, so unknown fields are refused by
the server here exactly as they are for users. The CRD is installed once per module and left
in place: the control plane is per session, and other modules may install the same CRD.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from stabletrain_contract.base import AS_WRITTEN
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.constants import (
    CRD_NAME,
    GROUP,
    PLURAL,
    VERSION,
    Action,
    AnomalyClass,
    ConditionType,
    Phase,
    Reason,
    Signal,
)
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import (
    Condition,
    Counters,
    Plan,
    RollbackRecord,
    StableTrainingJobStatus,
)
from stabletrain_operator.generate.crds import CRD_PATH, openapi_schema
from stabletrain_operator.generate.schema import apply_defaults
from stabletrain_operator.platform_policy.effective import effective_policy
from support.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "manifests"
Manifest = dict[str, Any]


def kubectl(
    plane: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> str:
    applied = kubectl(control_plane, "apply", "--server-side", "-f", str(REPO / CRD_PATH))
    assert applied.returncode == 0, applied.stderr
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = kubectl(control_plane, "get", "crd", CRD_NAME, "-o", f"jsonpath={jsonpath}")
        if state.stdout.strip() == "True":
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"CRD {CRD_NAME} not Established within 30 s: {state.stdout} {state.stderr}")
    return CRD_NAME


@pytest.fixture(scope="module")
def shared_namespace(crd: str, api_client: client.ApiClient) -> Iterator[str]:
    """One namespace for the malformed-manifest table: none of those objects is ever stored."""
    core = client.CoreV1Api(api_client)
    name = f"t-api-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def example(name: str) -> Manifest:
    loaded: Manifest = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return loaded


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


# --- the table of malformed manifests -------------------------------------------------

Mutation = Callable[[Manifest], None]


def put(path: str, value: Any) -> Mutation:
    """Set `value` at a dotted path under spec (list indices as numbers)."""

    def mutate(manifest: Manifest) -> None:
        *parents, leaf = path.split(".")
        node: Any = manifest["spec"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if leaf.isdigit():
            node[int(leaf)] = value
        else:
            node[leaf] = value

    return mutate


def drop(path: str) -> Mutation:
    def mutate(manifest: Manifest) -> None:
        *parents, leaf = path.split(".")
        node: Any = manifest["spec"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[leaf]

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(manifest: Manifest) -> None:
        for mutation in mutations:
            mutation(manifest)

    return mutate


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "r", "onSignals": ["LossSpike"], "action": "Rollback", **fields}


MALFORMED: list[tuple[str, Mutation, list[str]]] = [
    (
        "negative node count",
        put("workers.nodes", -1),
        ["spec.workers.nodes", "greater than or equal to 1"],
    ),
    (
        "node count of the wrong type",
        put("workers.nodes", "two"),
        ["spec.workers.nodes", "integer"],
    ),
    (
        "zero processes per node",
        put("workers.processesPerNode", 0),
        ["spec.workers.processesPerNode"],
    ),
    (
        "unknown field in workers",
        put("workers.replicas", 3),
        ['unknown field "spec.workers.replicas"'],
    ),
    ("misspelt spec section", put("detectoin", {}), ['unknown field "spec.detectoin"']),
    ("missing pod template", drop("workers.template"), ["spec.workers.template", "Required value"]),
    (
        "template without containers",
        put("workers.template", {"spec": {"containers": []}}),
        ["spec.workers.template.spec.containers", "at least 1 items"],
    ),
    (
        "privileged rendezvous port",
        put("workers.rendezvous", {"port": 80}),
        ["spec.workers.rendezvous.port"],
    ),
    (
        "unknown rendezvous backend",
        put("workers.rendezvous", {"backend": "etcd"}),
        ["spec.workers.rendezvous.backend"],
    ),
    (
        "both local tier sources",
        put("checkpoints.local.volume", {"emptyDir": {}}),
        ["spec.checkpoints.local", "exactly one of hostPath or volume"],
    ),
    (
        "local retention below 2",
        put("checkpoints.local.retention", 1),
        ["spec.checkpoints.local.retention", "greater than or equal to 2"],
    ),
    (
        "pfs retention below 2",
        put("checkpoints.pfs.retention", 1),
        ["spec.checkpoints.pfs.retention"],
    ),
    (
        "missing pfs claim",
        drop("checkpoints.pfs.claimName"),
        ["spec.checkpoints.pfs.claimName", "Required value"],
    ),
    (
        "four spike markers",
        put("checkpoints.spikeMarkers", 4),
        ["spec.checkpoints.spikeMarkers", "less than or equal to 3"],
    ),
    ("zero save interval", put("checkpoints.intervalSteps", 0), ["spec.checkpoints.intervalSteps"]),
    (
        "size that is no quantity",
        put("checkpoints.local.sizeLimit", "lots"),
        ["spec.checkpoints.local.sizeLimit"],
    ),
    (
        "loss spike ratio below 1",
        put("detection.lossSpike", {"ratio": 0.9}),
        ["spec.detection.lossSpike.ratio"],
    ),
    (
        "EMA factor above 1",
        put("detection.baseline", {"emaFactor": 1.5}),
        ["spec.detection.baseline.emaFactor"],
    ),
    (
        "throughput drop of 100%",
        put("detection.throughput", {"dropFraction": 1.0}),
        ["spec.detection.throughput.dropFraction"],
    ),
    (
        "unknown custom threshold kind",
        put("detection.custom", [{"name": "val", "kind": "Sideways", "threshold": 1}]),
        ["spec.detection.custom[0].kind", "Unsupported value"],
    ),
    (
        "relative jump ratio below 1",
        put("detection.custom", [{"name": "val", "kind": "RelativeJump", "threshold": 0.5}]),
        ["spec.detection.custom[0].threshold", "must exceed 1"],
    ),
    (
        "rule with an unknown action",
        put("recovery.rules", [rule(action="Reboot")]),
        ["spec.recovery.rules[0].action", "Unsupported value"],
    ),
    (
        "rule with an unknown signal",
        put("recovery.rules", [rule(onSignals=["LossSpikes"])]),
        ["spec.recovery.rules[0].onSignals[0]"],
    ),
    (
        "rule with an unknown class",
        put("recovery.rules", [rule(onClasses=["Cosmic"])]),
        ["spec.recovery.rules[0].onClasses[0]", "Unsupported value"],
    ),
    (
        "rule without signals",
        put("recovery.rules", [rule(onSignals=[])]),
        ["spec.recovery.rules[0].onSignals"],
    ),
    (
        "rule name with spaces",
        put("recovery.rules", [rule(name="Loss Spike")]),
        ["spec.recovery.rules[0].name"],
    ),
    (
        "LR factor of exactly 1",
        put("recovery.rules", [rule(rollback={"lrFactor": 1.0})]),
        ["spec.recovery.rules[0].rollback.lrFactor", "less than 1"],
    ),
    (
        "LR factor above 1",
        put("recovery.rules", [rule(rollback={"lrFactor": 1.5})]),
        ["spec.recovery.rules[0].rollback.lrFactor"],
    ),
    (
        "rollback params on an Alert rule",
        put("recovery.rules", [rule(action="Alert", rollback={})]),
        ["spec.recovery.rules[0].rollback", "only allowed on a rule whose action is Rollback"],
    ),
    (
        "duplicate rule names",
        put("recovery.rules", [rule(), rule(action="Alert")]),
        ["spec.recovery.rules[1]", "Duplicate value"],
    ),
    (
        "rule naming a custom signal the job's detection.custom does not define",
        both(
            put("detection.custom", [{"name": "entropy", "kind": "Below", "threshold": 1}]),
            put("recovery.rules", [rule(onSignals=["custom:val_loss"])]),
        ),
        ["spec.recovery.rules", "detection.custom defines"],
    ),
    (
        "unknown field in a rule",
        put("recovery.rules", [rule(params={"lrFactor": 0.5})]),
        ['unknown field "spec.recovery.rules[0].params"'],
    ),
    (
        "negative rollback budget",
        put("recovery.budgets", {"maxRollbacks": -1}),
        ["spec.recovery.budgets.maxRollbacks"],
    ),
    (
        "unknown escalation action",
        put("recovery.escalation", {"finalAction": "Panic"}),
        ["spec.recovery.escalation.finalAction", "Unsupported value"],
    ),
    (
        "escalation ending in another rollback",
        put("recovery.escalation", {"finalAction": "Rollback"}),
        ["spec.recovery.escalation.finalAction", 'supported values: "Fail", "Alert"'],
    ),
    ("suspend as a word", put("suspend", "yes"), ["spec.suspend", "boolean"]),
    (
        "manual rollback without request id",
        put("manualRollback", {"toStep": 100}),
        ["spec.manualRollback.requestId", "Required value"],
    ),
    (
        "skip range ending before it starts",
        put("manualRollback", {"requestId": "a", "skip": [{"first": 9, "last": 3}]}),
        ["spec.manualRollback.skip[0].last", "must not end before it starts"],
    ),
]


@pytest.mark.parametrize(
    ("mutation", "expected"), [pytest.param(m, e, id=i) for i, m, e in MALFORMED]
)
def test_malformed_manifest_is_rejected_naming_the_field(
    control_plane: ControlPlane, shared_namespace: str, mutation: Mutation, expected: list[str]
) -> None:
    manifest = copy.deepcopy(example("minimal"))
    manifest["metadata"]["name"] = f"bad-{uuid.uuid4().hex[:6]}"
    mutation(manifest)
    result = kubectl(
        control_plane, "apply", "-n", shared_namespace, "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    print(result.stderr.strip())
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr
    stored = kubectl(
        control_plane, "get", "stj", "-n", shared_namespace, manifest["metadata"]["name"]
    )
    assert stored.returncode != 0


def test_explicit_nulls_are_kept_for_the_operator_to_judge(
    api_client: client.ApiClient, shared_namespace: str
) -> None:
    """kubectl drops null fields before sending; API clients do not. The server keeps an
    explicit null (a disabled rule), which its CEL cannot tell from an absent field (one
    to inherit): whether a spike rule is left at all is judged on the effective detection
    by the operator (InvalidEffectivePolicy, naming detection.lossSpike)."""
    objects = client.CustomObjectsApi(api_client)
    manifest = copy.deepcopy(example("minimal"))
    manifest["metadata"]["name"] = f"nulls-{uuid.uuid4().hex[:6]}"
    manifest["spec"]["detection"] = {"lossSpike": {"ratio": None, "zscore": None}}
    created = objects.create_namespaced_custom_object(
        GROUP, VERSION, shared_namespace, PLURAL, manifest, field_validation="Strict"
    )
    assert created["spec"]["detection"] == {"lossSpike": {"ratio": None, "zscore": None}}
    spec = StableTrainingJobSpec.model_validate(created["spec"], context={AS_WRITTEN: True})
    judged = effective_policy(spec, [])
    assert judged.spec is None
    assert "detection.lossSpike" in judged.refusal
    assert "set ratio, zscore or both" in judged.refusal


def test_table_has_at_least_twenty_cases() -> None:
    assert len(MALFORMED) >= 20


# --- the examples, the defaults, the printer columns -------------------------------------


@pytest.mark.parametrize("name", ["minimal", "full"])
def test_example_is_accepted_with_the_documented_defaults(
    control_plane: ControlPlane, crd: str, namespace: str, name: str
) -> None:
    manifest = example(name)
    applied = kubectl(control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / f"{name}.yaml"))
    assert applied.returncode == 0, applied.stderr
    read = kubectl(
        control_plane, "get", "stj", manifest["metadata"]["name"], "-n", namespace, "-o", "json"
    )
    assert read.returncode == 0, read.stderr
    stored = json.loads(read.stdout)["spec"]
    documented = apply_defaults(openapi_schema()["properties"]["spec"], manifest["spec"])
    assert without_nulls(stored) == without_nulls(documented)
    # What the operator reads: the stored spec as written (detection and recovery only as far
    # as the job sets them), every other default the server filled in.
    as_written = StableTrainingJobSpec.model_validate(stored, context={AS_WRITTEN: True})
    dumped = as_written.model_dump(mode="json", exclude_unset=True)
    assert without_nulls(stored) == without_nulls(dumped)
    if name == "minimal":
        left_out = [key for key in ("detection", "recovery") if key in stored]
        assert left_out == [], "inherited from the namespace's StableTrainingPolicy defaults"
        assert stored["checkpoints"]["local"]["retention"] == 3
        effective = effective_policy(as_written, []).spec
        assert effective is not None, "no policy: the built-in defaults"
        assert effective.detection.loss_spike.ratio == 1.6
        assert effective.detection.grad_norm_spike.ratio == 4.0
        assert [r.name for r in effective.recovery.rules] == [
            "non-finite",
            "loss-spike",
            "infrastructure",
            "report-only",
        ]
        budgets = effective.recovery.budgets
        assert (budgets.max_rollbacks, budgets.max_restarts, budgets.cooldown_seconds) == (
            5,
            10,
            300,
        )


FIXED_AFTER_CREATION = [
    ("workers.nodes", 3, "spec.workers.nodes", "cannot change while the job exists"),
    ("workers.processesPerNode", 2, "spec.workers.processesPerNode", "no relaunch could restore"),
    ("checkpoints.pfs.claimName", "other-claim", "spec.checkpoints.pfs.claimName",
     "claimName cannot change while the job exists"),
    ("checkpoints.pfs.subPath", "elsewhere", "spec.checkpoints.pfs.subPath",
     "subPath cannot change while the job exists"),
    ("checkpoints.local.hostPath", "/var/lib/elsewhere", "spec.checkpoints.local.hostPath",
     "hostPath cannot change while the job exists"),
]  # fmt: skip


@pytest.mark.parametrize("case", FIXED_AFTER_CREATION, ids=[c[0] for c in FIXED_AFTER_CREATION])
def test_a_field_fixed_at_creation_is_refused_naming_the_field_and_why(
    control_plane: ControlPlane, crd: str, namespace: str, case: tuple[str, Any, str, str]
) -> None:
    path, value, field, why = case
    manifest = copy.deepcopy(example("minimal"))
    applied = kubectl(control_plane, "apply", "-n", namespace, "-f", "-",
                      stdin=yaml.safe_dump(manifest))  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    put(path, value)(manifest)
    edited = kubectl(control_plane, "apply", "-n", namespace, "-f", "-",
                     stdin=yaml.safe_dump(manifest))  # fmt: skip
    print(edited.stderr.strip())
    assert edited.returncode != 0, f"accepted: {edited.stdout}"
    assert field in edited.stderr
    assert why in edited.stderr
    # What a running job can take: the template (at the next attempt), the policy (live).
    manifest = copy.deepcopy(example("minimal"))
    manifest["spec"]["workers"]["template"]["spec"]["containers"][0]["image"] = "trainer:v2"
    manifest["spec"]["recovery"] = {"budgets": {"maxRollbacks": 2}}
    manifest["spec"]["checkpoints"]["intervalSteps"] = 50
    accepted = kubectl(control_plane, "apply", "-n", namespace, "-f", "-",
                       stdin=yaml.safe_dump(manifest))  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr


def test_get_shows_the_printer_columns(
    control_plane: ControlPlane, crd: str, namespace: str
) -> None:
    applied = kubectl(control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / "minimal.yaml"))
    assert applied.returncode == 0, applied.stderr
    status = {
        "status": {
            "phase": "Running",
            "step": 31219,
            "loss": 2.2,
            "lrScale": 0.5,
            "attempt": 2,
            "counters": {"rollbacks": 2},
        }
    }
    patched = kubectl(
        control_plane,
        "patch",
        "stj",
        "tiny-gpt",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    assert patched.returncode == 0, patched.stderr
    listed = kubectl(control_plane, "get", "stj", "-n", namespace)
    print(listed.stdout)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == [
        "NAME", "STATE", "QUEUE", "UNSCHEDULABLE", "STEP", "LOSS", "LR", "SCALE", "ROLLBACKS",
        "AGE",
    ]  # fmt: skip
    assert row.split()[:6] == ["tiny-gpt", "Running", "31219", "2.2", "0.5", "2"]
    by_category = kubectl(control_plane, "get", "stabletrain", "-n", namespace, "-o", "name")
    assert by_category.stdout.strip() == "stabletrainingjob.stabletrain.dev/tiny-gpt"


def operator_status() -> StableTrainingJobStatus:
    """A status with every kind of field the operator writes mid-rollback."""
    now = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    skip = SkipRange(first=31_169, last=31_469, shard_ids=("shard-00017",))
    return StableTrainingJobStatus(
        observed_generation=1,
        phase=Phase.PLANNING,
        conditions=(
            Condition(
                type=ConditionType.RECOVERING,
                status="True",
                observed_generation=1,
                last_transition_time=now,
                reason=Reason.ROLLBACK_STARTED,
                message="Loss spike at step 31219 (2.32x baseline); rolling back.",
            ),
        ),
        attempt=2,
        step=31_222,
        loss=5.1,
        loss_baseline=2.2,
        grad_norm=0.9,
        tokens_per_second=12_345.5,
        lr_scale=0.5,
        directives_generation=4,
        active_skip_ranges=(skip,),
        skip_ranges_total=1,
        checkpoints=(
            CheckpointRecord(
                step=31_000,
                attempt=2,
                stable=True,
                saved_at=now,
                pfs=TierCopy(complete=True, verified=True),
                local=(
                    NodeCopy(node="node-a", complete=True, verified=True),
                    NodeCopy(node="node-b", complete=True, verified=False),
                ),
            ),
        ),
        rollback_history=(
            RollbackRecord(
                time=now,
                action=Action.ROLLBACK,
                rule="loss-spike",
                signal=Signal.LOSS_SPIKE,
                anomaly_class=AnomalyClass.BAD_BATCH,
                onset_step=30_100,
                from_step=30_103,
                to_step=29_500,
                lr_scale=0.5,
                skipped=(skip,),
                attempt=2,
            ),
        ),
        counters=Counters(rollbacks=1, trips=2),
        plan=Plan(
            action=Action.ROLLBACK,
            rule="loss-spike",
            signal=Signal.LOSS_SPIKE,
            anomaly_class=AnomalyClass.BAD_BATCH,
            onset_step=31_219,
            from_step=31_222,
            started_at=now,
            from_attempt=2,
            next_attempt=3,
            target_step=31_000,
            lr_scale=0.25,
            rewarmup_steps=100,
            added_skip=(skip,),
        ),
        last_trip=TripReport(
            attempt=2,
            node="node-a",
            step=31_222,
            tripped_at=now,
            signal=Signal.LOSS_SPIKE,
            anomaly_class=AnomalyClass.BAD_BATCH,
            evidence="loss 5.10 is 2.32x its baseline 2.20 for 4 steps",
            value=5.1,
            threshold=3.52,
            onset_step=31_219,
            last_good_step=31_218,
            firing=("LossSpike",),
            inventory=((31_000, 2, 63),),
            lineage_path="/pfs/lineage/attempt-2/window-31169.jsonl",
            suspect_shards=("shard-00017",),
        ),
        last_manual_request_id="req-1",
    )


def test_status_the_operator_writes_survives_the_server_unchanged(
    control_plane: ControlPlane, crd: str, namespace: str
) -> None:
    """A structural schema prunes undeclared status fields: every field the operator's model
    writes (the rollback plan above all) must come back exactly as written."""
    applied = kubectl(control_plane, "apply", "-n", namespace, "-f", str(EXAMPLES / "minimal.yaml"))
    assert applied.returncode == 0, applied.stderr
    written = operator_status()
    body = {"status": written.model_dump(mode="json", exclude_none=True)}
    patched = kubectl(
        control_plane,
        "patch",
        "stj",
        "tiny-gpt",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(body),
    )
    assert patched.returncode == 0, patched.stderr
    read = kubectl(control_plane, "get", "stj", "tiny-gpt", "-n", namespace, "-o", "json")
    stored = json.loads(read.stdout)["status"]
    assert StableTrainingJobStatus.model_validate(stored) == written
    assert stored == apply_defaults(openapi_schema()["properties"]["status"], body["status"])
