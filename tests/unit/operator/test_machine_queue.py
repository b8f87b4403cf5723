"""The state machine with a Kueue admission: held while queued, placed by the admitted
flavors, an eviction handled as spec.suspend (save, stop) with Kueue's reason, resumed from
that save when admitted again, and recoveries that keep the admission."""

from __future__ import annotations

from datetime import timedelta

from operator_builders import T0, agent, pod, record, spec
from test_machine import CHECKPOINTS, conditions, running, tripped_pods, world

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.status import QueueState, StableTrainingJobStatus
from stabletrain_operator.machine import advance
from stabletrain_operator.plan.sent_directives import attempt_directives
from stabletrain_operator.pods import JobRef, build_pod
from stabletrain_operator.queue.admission import Admission, Placement, placement_of
from stabletrain_operator.queue.facts import Eviction

GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
FLAVOR = {"spec": {"nodeLabels": {"pool": "a100"}, "tolerations": [GPU]}}
PLACEMENT = placement_of([FLAVOR])
QUEUED = Admission("team-a", "wl")
ADMITTED = Admission("team-a", "wl", admitted=True, cluster_queue="cq", placement=PLACEMENT)
EVICTED = Admission(
    "team-a", "wl", admitted=True, cluster_queue="cq", placement=PLACEMENT,
    eviction=Eviction("Preempted", "Preempted to accommodate a higher priority workload"),
)  # fmt: skip


def test_a_queued_job_creates_no_pod_until_admitted_then_places_them_in_the_flavor() -> None:
    pending = StableTrainingJobStatus()
    held = advance(pending, world(pending, admission=QUEUED))
    assert held.launch is None
    assert held.status.phase is Phase.PENDING
    assert held.status.queue is not None
    assert (held.status.queue.state, held.status.queue.workload) == (QueueState.QUEUED, "wl")
    assert conditions(held)["Admitted"] == ("False", "Queued")
    assert [e.reason for e in held.events] == ["Queued"]
    still = advance(held.status, world(held.status, admission=QUEUED))
    assert still.events == (), "one Event per change"
    started = advance(held.status, world(held.status, admission=ADMITTED))
    assert started.status.phase is Phase.RUNNING
    assert started.launch is not None
    assert started.launch.placement == PLACEMENT
    assert started.status.queue is not None
    assert (started.status.queue.state, started.status.queue.cluster_queue) == (
        QueueState.ADMITTED, "cq",
    )  # fmt: skip
    assert conditions(started)["Admitted"] == ("True", "Admitted")
    assert "Admitted" in [e.reason for e in started.events]


def test_without_a_queue_the_job_starts_at_once() -> None:
    pending = StableTrainingJobStatus()
    started = advance(pending, world(pending))
    assert started.launch is not None
    assert started.launch.placement is None
    assert started.status.queue is None


def test_pods_carry_the_flavors_labels_and_tolerations_besides_the_avoided_nodes() -> None:
    """A relaunch away from a suspect node stays inside the admitted flavor."""
    job = spec()
    built = build_pod(job, JobRef("job", "ns", "uid"), 1, 0, "node-a", avoid_nodes=("node-b",),
                      avoid_required=True, placement=PLACEMENT)  # fmt: skip
    pod_spec = built["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "a100"}
    assert GPU in pod_spec["tolerations"]
    affinity = pod_spec["affinity"]["nodeAffinity"]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-b"]
    assert Placement().node_selector == ()


def test_a_rollback_keeps_the_admission_and_relaunches_inside_the_flavor() -> None:
    status = running()
    stop = advance(status, world(status, pods=tripped_pods(), admission=ADMITTED))
    assert stop.status.phase is Phase.STOPPING
    planning = advance(stop.status, world(stop.status, admission=ADMITTED))
    planned = advance(planning.status, world(planning.status, admission=ADMITTED))
    assert planned.status.phase is Phase.RELAUNCHING
    relaunched = advance(planned.status, world(planned.status, admission=ADMITTED))
    assert relaunched.status.phase is Phase.CONFIRMING
    assert relaunched.launch is not None
    assert relaunched.launch.placement == PLACEMENT
    assert relaunched.status.queue is not None
    assert relaunched.status.queue.state is QueueState.ADMITTED
    assert all(e.reason != "Queued" for step in (stop, planning, planned, relaunched)
               for e in step.events)  # fmt: skip


def test_eviction_saves_stops_waits_and_resumes_from_the_save_when_admitted_again() -> None:
    status = running(queue={"state": "Admitted", "workload": "wl", "localQueue": "team-a",
                            "clusterQueue": "cq"})  # fmt: skip
    job = spec()
    base = attempt_directives(job, generation=1, attempt=0, resume_step=None, lr_scale=1.0,
                              rewarmup_steps=0, skip=())  # fmt: skip
    pods = (pod(0), pod(1))
    asking = advance(status, world(status, pods=pods, attempt_directives=base, admission=EVICTED))
    assert asking.status.phase is Phase.RUNNING, "the pods save first"
    assert asking.live is not None
    assert asking.live.save_request == 2
    assert conditions(asking)["Suspended"] == ("True", "Evicted")
    assert conditions(asking)["Admitted"] == ("False", "Preempted"), "Kueue's own reason"
    assert asking.status.queue is not None
    assert asking.status.queue.state is QueueState.EVICTED
    reasons = [e.reason for e in asking.events]
    assert "Evicted" in reasons
    (evicted,) = [e for e in asking.events if e.reason == "Evicted" and e.type == "Warning"]
    assert "Preempted" in evicted.message
    saved = tuple(
        agent(r, step=63, generation=2, records=(*CHECKPOINTS, record(63)), saved_request=2,
              saved_step=63)
        for r in (0, 1)
    )  # fmt: skip
    stopping = advance(asking.status, world(asking.status, pods=pods, scrapes=saved,
                                            admission=EVICTED))  # fmt: skip
    assert stopping.status.phase is Phase.STOPPING
    assert stopping.delete_pods == ("job-a0-0", "job-a0-1")
    assert "Kueue evicted the job (Preempted" in stopping.events[0].message
    suspended = advance(stopping.status, world(stopping.status, admission=EVICTED))
    assert suspended.status.phase is Phase.SUSPENDED
    given_back = Admission("team-a", "wl", waiting="couldn't assign flavors")
    waiting = advance(suspended.status, world(suspended.status, admission=given_back))
    assert waiting.status.phase is Phase.SUSPENDED, "waits for readmission"
    assert waiting.status.queue is not None
    assert waiting.status.queue.state is QueueState.EVICTED
    later = T0 + timedelta(minutes=5)
    resumed = advance(waiting.status, world(waiting.status, admission=ADMITTED, now=later))
    assert resumed.status.phase is Phase.PLANNING
    assert conditions(resumed)["Suspended"] == ("False", "Resumed")
    planned = advance(resumed.status, world(resumed.status, admission=ADMITTED, now=later))
    assert planned.status.plan is not None
    assert planned.status.plan.target_step == 63, "the final checkpoint"
    relaunched = advance(planned.status, world(planned.status, admission=ADMITTED, now=later))
    assert relaunched.launch is not None
    assert relaunched.launch.placement == PLACEMENT
    assert relaunched.status.counters.restarts == 0, "an eviction spends no budget"


def test_eviction_during_a_recovery_holds_the_plan_until_admitted_again() -> None:
    status = running()
    stop = advance(status, world(status, pods=tripped_pods(), admission=ADMITTED))
    planning = advance(stop.status, world(stop.status, admission=EVICTED))
    planned = advance(planning.status, world(planning.status, admission=EVICTED))
    assert planned.status.phase is Phase.RELAUNCHING
    held = advance(planned.status, world(planned.status, admission=EVICTED))
    assert held.launch is None
    assert held.status.phase is Phase.RELAUNCHING
    assert held.status.plan == planned.status.plan, "the rollback's plan is kept"
    relaunched = advance(held.status, world(held.status, admission=ADMITTED))
    assert relaunched.launch is not None
    assert relaunched.status.plan is not None
    assert relaunched.status.plan.lr_scale == 0.5
