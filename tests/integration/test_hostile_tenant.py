"""The hostile tenant (issue 29): a job's author, anything running in its pods, or anyone who
can write its storage, tries to get more than its own job from the shared operator and the
job's own processes. One section per point of the issue; each test says what it asserted
before the fix and what it asserts now.

Points 2 (signed checkpoints), 3 (bounded scrapes and servers), 6 (the agent's side: the
generation bound and the explicit hand-over) and 8 (version skew) are here; points 1, 4, 5,
6 (the NetworkPolicy) and 7 have sections of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import pickle
import select
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from stabletrain_agent.checkpoint.layout import MANIFEST_NAME
from stabletrain_agent.contract.base import ContractError
from stabletrain_agent.contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    MAX_ACK_BYTES,
    MAX_STATUS_BYTES,
    DirectiveAck,
    LiveOutcome,
    bearer,
    new_token,
    parse_directive_ack,
    status_credential,
)
from stabletrain_agent.contract.directives import GENERATION_ADVANCE_MAX, Directives
from stabletrain_agent.contract.names import Action
from stabletrain_agent.directive_inbox import DirectiveSource
from stabletrain_agent.export import AgentExporter
from stabletrain_agent.http_server import MAX_CONNECTIONS
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.directive_put import AgentUnreachableError, put_directives
from stabletrain_operator.machine import Transition, World, advance
from stabletrain_operator.naming import ATTEMPT_LABEL, JOB_LABEL, RANK_LABEL
from stabletrain_operator.observe.pods import PodFacts, pod_facts
from stabletrain_operator.observe.scrape import ScrapeError, Scraper, ScrapeResult, ScrapeTarget
from stabletrain_operator.policy import PolicyLedger
from support.agent_client import fetch_status
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, job_manifest
from support.processes import ManagedProcess, free_port

HERE = Path(__file__).parent
WORKLOADS = HERE.parent / "support" / "workloads"
MIB = 1024 * 1024
Json = dict[str, Any]
TOKEN = new_token()


# --- shared: an agent endpoint a hostile pod controls, in a process of its own -------------


class HostileAgent:
    """tests/support/workloads/hostile_agent.py serving the files of one directory."""

    def __init__(self, directory: Path, process: ManagedProcess, port: int) -> None:
        self.directory = directory
        self.process = process
        self.url = f"http://127.0.0.1:{port}"

    def serve(self, case: str, body: bytes) -> str:
        """`body` as case `case`; the base URL an agent of that case has."""
        (self.directory / f"{case}.json").write_bytes(body)
        return f"{self.url}/{case}"


@pytest.fixture
def hostile_agent(tmp_path: Path) -> Iterator[HostileAgent]:
    directory = tmp_path / "served"
    directory.mkdir()
    port = free_port()
    process = ManagedProcess(
        "hostile-agent",
        ["python", str(WORKLOADS / "hostile_agent.py"), str(directory), str(port)],
        tmp_path / "hostile-agent.log",
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.alive(), process.log_tail()
                assert time.monotonic() < deadline, "the hostile agent never listened"
                time.sleep(0.05)
        yield HostileAgent(directory, process, port)
    finally:
        process.stop()


def good_status(attempt: int = 0) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "node": "node-b",
        "nodeRank": 1,
        "updatedAt": "2026-11-29T10:00:00Z",
        "step": 12,
        "lrScale": 1.0,
        "appliedGeneration": 1,
    }


def peak_bytes_of(work: Any) -> tuple[Any, int]:
    """Run the coroutine `work` and return its result with the peak of Python memory it
    allocated (tracemalloc: the objects an operator would hold, not the C library's)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = asyncio.run(work)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


# --- point 2: a checkpoint is restored only if this job wrote it ---------------------------

GUARDED_WORKER = WORKLOADS / "guarded_worker.py"
PLANTED_MARKER = "pwned-by-a-planted-checkpoint"
"""A file the planted pickle creates on the PFS if any pod ever unpickles it."""


class CreatesAFile:
    """A pickle that, when loaded, creates a file: any code could run in its place."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def plant(copy: Path, name: str, content: bytes) -> None:
    """Replace one file of a committed copy and fix the manifest's size and checksums, as
    anyone who can write the tier can (another job on the same hostPath or claim); the
    signature, which needs the job's key, stays as it was."""
    (copy / name).write_bytes(content)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    entry = manifest["files"][name]
    entry.update(size=len(content), crc32=f"{zlib.crc32(content):08x}")
    if entry.get("sha256"):
        entry["sha256"] = hashlib.sha256(content).hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))


def copies_of_step(cluster: LocalCluster, host_path: str, pfs: Path, step: int) -> list[Path]:
    """Every copy of `step`: each node's local copies under its hostPath, each PFS part."""
    name = f"step-{step:010d}"
    local = [
        copy
        for node in cluster.node_names
        for copy in cluster.host_path(node, host_path).glob(f"node-*/{name}/attempt-*")
    ]
    return local + sorted((pfs / name).glob("attempt-*/node-*"))


def test_a_planted_checkpoint_is_refused_unread_and_the_job_falls_back(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    """A tenant who can write the job's tiers replaces the metadata of the job's newest
    stable checkpoint, on every copy, with a pickle that creates a file, and fixes the
    manifests' sizes and checksums; then the job is rolled back to that step. Before: the
    copies verified (CRC-32 and sizes match) and the relaunched pods unpickled the file
    (it appeared on the PFS). Now: no copy verifies without the job's key, none is
    unpickled, the pods name each in a CheckpointRejected Event, and the rollback lands on
    the newest checkpoint before it."""
    name = "signed"
    manifest = job_manifest(
        name, {"ST_STEPS": "3000", "ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5"}
    )
    manifest["spec"]["workers"]["template"]["spec"]["containers"][0]["command"] = [
        "torchrun", str(GUARDED_WORKER),
    ]  # fmt: skip
    tiers = manifest["spec"]["checkpoints"]
    tiers["local"]["retention"] = tiers["pfs"]["retention"] = 100  # none gone before the test
    jobs.create(manifest)
    pfs = local_cluster.shared_dir / job_namespace / "pfs"
    marker = pfs / PLANTED_MARKER

    def stable_on_pfs(status: Json) -> list[int]:
        return [c["step"] for c in status.get("checkpoints") or []
                if c["stable"] and c["pfs"]["verified"]]  # fmt: skip

    ready = jobs.wait(name, lambda s: len(stable_on_pfs(s)) >= 3, 240, "three stable checkpoints")
    target = max(stable_on_pfs(ready))
    planted = copies_of_step(local_cluster, tiers["local"]["hostPath"], pfs, target)
    assert len(planted) >= 3, planted  # two nodes' local copies and the PFS parts
    hostile = pickle.dumps(CreatesAFile(f"/stabletrain/pfs/{PLANTED_MARKER}"))
    for copy in planted:
        plant(copy, ".metadata", hostile)
    jobs.patch_spec(name, {"manualRollback": {"requestId": "tenant", "toStep": target}})

    def relaunched(status: Json) -> bool:
        history = status.get("rollbackHistory") or []
        return (
            status.get("lastManualRequestId") == "tenant"
            and status.get("phase") in ("Running", "Confirming")
            and bool(history)
            and history[-1].get("toStep") is not None
            and any(
                e["reason"] == "CheckpointRejected" and f"step-{target:010d}" in e["message"]
                for e in jobs.events(name)
            )
        )

    done = jobs.wait(name, lambda s: marker.exists() or relaunched(s), 300, "the rollback")
    rejected = [e["message"] for e in jobs.events(name) if e["reason"] == "CheckpointRejected"]
    print(
        f"\nplanted step {target} ({len(planted)} copies); the rollback went to step "
        f"{done['rollbackHistory'][-1].get('toStep')}; Events:\n  " + "\n  ".join(rejected)
    )
    assert not marker.exists(), "a pod unpickled the planted checkpoint"
    assert done["rollbackHistory"][-1]["toStep"] < target
    assert "CheckpointsUnsigned" not in [e["reason"] for e in jobs.events(name)]


# --- point 3: one job cannot exhaust the shared operator ------------------------------------


def flood_status(entries: int, size: int) -> bytes:
    """A status of `entries` empty inventory entries, padded with JSON whitespace to `size`."""
    head = json.dumps(good_status())[:-1].encode() + b', "inventory": ['
    body = head + b",".join([b"{}"] * entries) + b"]}"
    assert len(body) <= size, (len(body), size)
    return body + b" " * (size - len(body))


def scrape_round(targets: list[ScrapeTarget]) -> tuple[dict[str, Any], int]:
    """One round through a shared Scraper, as the operator scrapes; its results by pod and
    the peak of Python memory it took."""

    async def one_round() -> dict[str, Any]:
        scraper = Scraper()
        try:
            return {r.pod: r for r in await scraper.scrape_all(targets, timeout=30.0)}
        finally:
            await scraper.close()

    results: dict[str, Any]
    results, peak = peak_bytes_of(one_round())
    return results, peak


def test_a_1_mib_status_of_100000_entries_leaves_the_operators_memory_bounded(
    hostile_agent: HostileAgent,
) -> None:
    """Before: a status of up to 1 MiB was read and parsed whole: 100,000 entries became
    hundreds of thousands of validation errors and their messages (the peak is printed).
    Now: no body over MAX_STATUS_BYTES is read (refused unread when its length says so, cut
    off when it gives none), a body under the cap stops at its first bad entry, and a good
    pod scraped in the same round by the same shared scraper is read as always. Each hostile
    pod costs less than two bodies at the cap, and nothing once the round is over."""
    flood = flood_status(100_000, MIB)
    good = ScrapeTarget("good", hostile_agent.serve("good", json.dumps(good_status()).encode()), 0)
    hostile = [
        ScrapeTarget("flood", hostile_agent.serve("flood", flood), 0),
        ScrapeTarget("flood-unsized", hostile_agent.serve("flood-unsized", flood), 0),
        ScrapeTarget(
            "packed", hostile_agent.serve("packed", flood_status(40_000, MAX_STATUS_BYTES - 1)), 0
        ),
    ]
    _, alone = scrape_round([good])
    results, peak = scrape_round([*hostile, good])
    per_pod = (peak - alone) / len(hostile)
    print(
        f"\noperator memory (Python objects) for one scrape round: {alone / MIB:.2f} MiB for "
        f"a good pod alone, {peak / MIB:.2f} MiB with 3 hostile pods beside it (a 1 MiB status "
        f"of 100,000 entries with and without a length, {MAX_STATUS_BYTES - 1} bytes of "
        f"40,000 entries): {per_pod / 1024:.0f} KiB a hostile pod"
    )
    assert results["good"].status is not None
    assert results["good"].status.step == 12
    assert results["flood"].error is ScrapeError.TOO_LARGE
    assert results["flood-unsized"].error is ScrapeError.TOO_LARGE
    assert results["packed"].error is ScrapeError.MALFORMED
    assert all(results[t.pod].status is None for t in hostile)
    assert per_pod < 2 * MAX_STATUS_BYTES, f"{per_pod:.0f} bytes a hostile pod"


def test_a_huge_answer_to_a_directive_put_is_not_read(hostile_agent: HostileAgent) -> None:
    """Before: the answer to a PUT was read whole, however long (64 MiB here), before it
    was found not to be an acknowledgement. Now: no more than MAX_ACK_BYTES is read."""
    flood = b"x" * (64 * MIB)
    sized = hostile_agent.serve("put-flood", flood)
    unsized = hostile_agent.serve("put-flood-unsized", flood)
    directives = Directives(generation=2, attempt=0)

    async def put_both() -> list[BaseException | object]:
        return list(
            await asyncio.gather(
                put_directives(None, sized, directives, "token", 30.0),
                put_directives(None, unsized, directives, "token", 30.0),
                return_exceptions=True,
            )
        )

    outcomes, peak = peak_bytes_of(put_both())
    print(f"\noperator memory for two PUTs answered with 64 MiB each: peak {peak / MIB:.2f} MiB")
    for outcome in outcomes:
        assert isinstance(outcome, ValueError), outcome  # a ContractError
        assert f"over {MAX_ACK_BYTES} bytes" in str(outcome)
    assert peak < 4 * MAX_STATUS_BYTES, f"peak {peak} bytes"


def agent_threads() -> int:
    """Threads serving connections of an agent's HTTP server in this process."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_the_agents_server_holds_a_bounded_number_of_connections() -> None:
    """Before: every connection got a thread in the training process for as long as its
    client kept it open (200 idle connections, 200 threads). Now: MAX_CONNECTIONS at once,
    each one beyond answered 503 and closed by the accepting thread, and the operator's
    scrape is served once the flood has gone."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    flood: list[socket.socket] = []
    try:
        before = agent_threads()
        for _ in range(200):
            flood.append(socket.create_connection(("127.0.0.1", exporter.port), timeout=5))
        # A refused connection is answered at once; a held one waits for its request (it
        # is dropped only after REQUEST_TIMEOUT_SECONDS of silence).
        refused: set[socket.socket] = set()
        held = 0
        deadline = time.monotonic() + 5
        while len(refused) + held < len(flood) and time.monotonic() < deadline:
            waiting = [c for c in flood if c not in refused]
            readable, _, _ = select.select(waiting, [], [], 0.2)
            for connection in readable:
                answer = connection.recv(64)
                assert answer.startswith(b"HTTP/1.1 503"), answer
                refused.add(connection)
            held = agent_threads() - before
        print(f"\n200 idle connections: {held} served by a thread, {len(refused)} refused "
              "with 503")  # fmt: skip
        assert len(refused) == len(flood) - held
        assert held <= MAX_CONNECTIONS
    finally:
        for connection in flood:
            connection.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status = fetch_status(exporter.url, credential=status_credential(TOKEN))
                break
            except (ContractError, AgentUnreachableError):
                assert time.monotonic() < deadline, "the agent never served again"
                time.sleep(0.1)
        assert status.applied_generation == 1
    finally:
        exporter.stop()


# --- point 6, the agent's side: the generation and the hand-over --------------------------


def raw_put(exporter: AgentExporter, body: dict[str, Any]) -> tuple[int, DirectiveAck]:
    """A PUT of `body` as JSON with the job's token: what any holder of the token can send."""
    connection = HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    try:
        connection.request(
            "PUT", DIRECTIVES_HTTP_PATH, json.dumps(body).encode(),
            {AUTHORIZATION_HEADER: bearer(TOKEN), "Content-Type": "application/json"},
        )  # fmt: skip
        response = connection.getresponse()
        return response.status, parse_directive_ack(response.read())
    finally:
        connection.close()


def test_a_forged_generation_is_bounded_and_the_operators_next_directive_applies() -> None:
    """Before: a token holder could PUT generation 2^62 and every later directive of the
    operator (generation 2, 3, ...) was 'not newer' for that pod until it was relaunched.
    Now: a generation beyond GENERATION_MAX is refused, and so is one more than
    GENERATION_ADVANCE_MAX ahead of the pod's; the operator's next directive applies."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        pinned, pinned_ack = raw_put(exporter, {"generation": 2**62, "attempt": 0})
        ahead, ahead_ack = raw_put(
            exporter, {"generation": 2 + GENERATION_ADVANCE_MAX, "attempt": 0}
        )
        operator, operator_ack = raw_put(exporter, {"generation": 2, "attempt": 0, "lrScale": 0.5})
        print(f"\ngeneration 2^62: {pinned} {pinned_ack.message}")
        print(f"generation {2 + GENERATION_ADVANCE_MAX}: {ahead} {ahead_ack.message}")
        print(f"the operator's generation 2: {operator} {operator_ack.outcome}")
        assert operator_ack.outcome is LiveOutcome.APPLIED
        assert (operator, source.applied_generation) == (200, 2)
        assert pinned == 400
        assert "generation" in pinned_ack.message
        assert ahead == 409
        assert ahead_ack.outcome is LiveOutcome.GENERATION_TOO_FAR
    finally:
        exporter.stop()


def test_only_the_operators_read_hands_the_checkpoints_over() -> None:
    """Before: any GET of /v1/status ended the hand-over of a process that ends on an error,
    so another pod's read could let it go before the operator saw its newest copies. Now:
    only a read presenting the job's status credential (the operator's scrape) counts."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        exporter.set_inventory([])  # a scan the operator has not seen yet
        fetch_status(exporter.url)  # anyone's read
        by_anyone = exporter.await_inventory_served(1.0)
        fetch_status(exporter.url, credential=status_credential(TOKEN))  # the operator's
        by_operator = exporter.await_inventory_served(10.0)
        print(f"\nhanded over by an unauthenticated read: {by_anyone}; by the operator's: "
              f"{by_operator}")  # fmt: skip
        assert by_operator
        assert not by_anyone
    finally:
        exporter.stop()


# --- point 8: version skew ------------------------------------------------------------------

SKEW = HERE / "skew"
OLDER_AGENTS = sorted(p.name for p in SKEW.glob("agent-*"))
"""Recorded by tests/support/skew_record.py: agent-34a60b2 (the first contract) and
agent-e09edf5 (main before signing and the bounds: what runs while the operator upgrades)."""
NODES = ("node-a", "node-b")


def skew_spec() -> StableTrainingJobSpec:
    rollback = {"minStepsBeforeOnset": 10, "skipStepsBeforeOnset": 2,
                "skipStepsAfterOnset": 5, "rewarmupSteps": 4}  # fmt: skip
    return StableTrainingJobSpec.model_validate(
        {
            "workers": {
                "nodes": 2,
                "template": {"spec": {"containers": [{"name": "t", "command": ["torchrun"]}]}},
            },
            "checkpoints": {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"}},
            "recovery": {
                "rules": [
                    {
                        "name": "spike",
                        "onSignals": ["LossSpike"],
                        "action": "Rollback",
                        "rollback": rollback,
                    },
                ],
                "budgets": {"maxRollbacks": 2, "cooldownSeconds": 0},
            },
        }
    )


def failed_pod(rank: int, message: str) -> PodFacts:
    """The pod as the operator's pod watch reads it from the API server's JSON."""
    facts = pod_facts(
        {
            "metadata": {
                "name": f"job-a1-{rank}",
                "labels": {JOB_LABEL: "job", ATTEMPT_LABEL: "1", RANK_LABEL: str(rank)},
            },
            "spec": {"nodeName": NODES[rank]},
            "status": {
                "phase": "Failed",
                "podIP": f"10.0.0.{rank + 2}",
                "containerStatuses": [
                    {
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "message": message,
                                "finishedAt": "2026-11-29T10:00:01Z",
                            }
                        }
                    }
                ],
            },
        }
    )
    assert facts is not None
    return facts


def rollback_from(message: str, scrapes: tuple[ScrapeResult, ...]) -> tuple[Transition, Transition]:
    """Today's operator, from a trip of attempt 1 reported by `message` and the pods'
    statuses `scrapes`, through the rollback to the relaunch: (the stop, the relaunch)."""
    spec = skew_spec()
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=1, directives_generation=2, step=132
    )

    def world(now: StableTrainingJobStatus, **changes: Any) -> World:
        return World(**{
            "now": datetime(2026, 11, 29, 10, 0, 2, tzinfo=UTC), "job": "job", "spec": spec,
            "generation": 1, "pods": (), "ledger": PolicyLedger.from_job_status(now),
            "previous_nodes": NODES, **changes,
        })  # fmt: skip

    pods = tuple(failed_pod(rank, message) for rank in (0, 1))
    stop = advance(status, world(status, pods=pods, scrapes=scrapes))
    planning = advance(stop.status, world(stop.status))
    relaunching = advance(planning.status, world(planning.status))
    return stop, advance(relaunching.status, world(relaunching.status))


def declared_keys_only(value: Any, schema: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Keys of `value` that the JSON schema `node` (of `schema`) does not declare: what an
    agent refuses, since every agent refuses unknown fields of its directives."""
    if "$ref" in node:
        return declared_keys_only(value, schema, schema["$defs"][node["$ref"].split("/")[-1]])
    for branch in node.get("anyOf", ()):
        if branch.get("type") != "null" and value is not None:
            return declared_keys_only(value, schema, branch)
    unknown: list[str] = []
    if isinstance(value, dict):
        properties = node.get("properties", {})
        for key, item in value.items():
            if key not in properties:
                unknown.append(key)
            else:
                unknown += [f"{key}.{k}" for k in declared_keys_only(item, schema, properties[key])]
    elif isinstance(value, list) and "items" in node:
        for item in value:
            unknown += declared_keys_only(item, schema, node["items"])
    return unknown


@pytest.mark.parametrize("agent", OLDER_AGENTS)
def test_an_older_agent_and_todays_operator_understand_each_other(
    agent: str, hostile_agent: HostileAgent
) -> None:
    """A rolling operator upgrade with running jobs. Before: the operator read an older
    agent's status and trip report, but every directive it wrote carried all of its fields,
    saveRequest among them, which an agent older than that field refuses: the relaunched
    pods of the rollback could not start. Now: the status (over HTTP, through the scraper)
    and the trip report (from the pod's JSON, through the pod watch's parser) are read and
    acted on, and the directives of the rollback they cause use only fields that agent
    knows."""
    recorded = SKEW / agent
    url = hostile_agent.serve(agent, (recorded / "status.json").read_bytes())
    results, _ = scrape_round([ScrapeTarget(f"job-a1-{rank}", url, 1) for rank in (0, 1)])
    scrapes = tuple(results.values())
    assert all(r.status is not None and r.error is None for r in scrapes), scrapes
    message = (recorded / "termination-message.json").read_text().strip()

    stop, relaunch = rollback_from(message, scrapes)

    assert stop.decision is not None
    assert (stop.decision.action, stop.decision.signal) == (Action.ROLLBACK, "LossSpike")
    assert relaunch.launch is not None
    directives = relaunch.launch.directives
    assert (directives.attempt, directives.resume_step) == (2, 110), "from the old inventory"
    wire = json.loads(directives.to_json())
    schema = json.loads((recorded / "directives.schema.json").read_text())
    print(f"\n{agent}: trip and status read, rollback to step {directives.resume_step}; "
          f"the relaunch's directives: {sorted(wire)}")  # fmt: skip
    assert declared_keys_only(wire, schema, schema) == []


def newer(value: dict[str, Any]) -> dict[str, Any]:
    """`value` as an agent one release newer sends it: an optional field more at every level."""
    grown = {**value, "fieldOfANewerAgent": {"any": ["shape"]}}
    for key, item in value.items():
        if isinstance(item, dict):
            grown[key] = newer(item)
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            grown[key] = [newer(entry) for entry in item]
    return grown


def test_an_agent_one_optional_field_newer_is_read(hostile_agent: HostileAgent) -> None:
    """Before: the contract models refused unknown fields, so an agent one optional field
    newer than the operator had every status scrape Malformed and its trip report read as
    an invalid one (a worker failure without a reason). Now: what an agent reports is read
    with the fields the operator knows; the rest is ignored."""
    recorded = SKEW / "agent-e09edf5"
    status = newer(json.loads((recorded / "status.json").read_text()))
    report = newer(json.loads((recorded / "termination-message.json").read_text()))
    url = hostile_agent.serve("newer", json.dumps(status).encode())
    results, _ = scrape_round([ScrapeTarget("job-a1-0", url, 1)])
    (result,) = results.values()
    ack = parse_directive_ack(json.dumps(newer({"appliedGeneration": 3, "message": "ok"})))

    facts = failed_pod(0, json.dumps(report))

    assert result.error is None, result.detail
    assert result.status is not None
    assert result.status.inventory[0].pfs.verified
    assert facts.trip is not None
    assert facts.trip.signal == "LossSpike"
    assert ack.applied_generation == 3
