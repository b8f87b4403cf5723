"""Record what an agent of an older commit sends and accepts, for the version-skew tests.

    cd tests && python -m support.skew_record <commit> [<commit> ...]

For each commit, its own contract package (`git archive` of that commit's
contract/stabletrain_contract, or trainer-agent/stabletrain_agent/contract before the
contract became a package of its own; nothing else) runs in a fresh interpreter and
writes, under tests/integration/skew/agent-<commit>/:

- status.json: an AgentStatus as its agent serves it, firing a signal, with an inventory
  and the trip report below;
- termination-message.json: a TripReport as its agent renders it for the pod status;
- directives.schema.json: the JSON schema of the Directives it accepts (unknown fields are
  refused by every agent), which today's operator's directives must satisfy;
- directives-defaults.json: its Directives with every field at its default, which today's
  must equal where both have the field (the operator leaves defaults out).

The payloads are that commit's own serialisation of fixed values: the fields it knows,
named and shaped as it names and shapes them. Only the field names common to every
recorded commit are passed, so one builder serves all of them.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "integration" / "skew"
CONTRACTS = ("contract/stabletrain_contract", "trainer-agent/stabletrain_agent/contract")
"""Where the contract lived, newest first."""
SOURCE_ROOTS = [str(REPO / root) for root in ("contract", "operator", "trainer-agent")]
"""This checkout's package roots, which an editable install puts on every interpreter's path."""

BUILDER = r"""
import importlib, json, sys
from datetime import datetime, timezone
from pathlib import Path

def first(*names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names)

channel = first("stabletrain_contract.channel", "stabletrain_agent.contract.channel")
directives = first("stabletrain_contract.directives", "stabletrain_agent.contract.directives")
inventory = first("stabletrain_contract.checkpoint.inventory",
                  "stabletrain_agent.contract.checkpoint_inventory",
                  "stabletrain_agent.contract.inventory")
trip = first("stabletrain_contract.trip_report", "stabletrain_agent.contract.trip_report",
             "stabletrain_agent.contract.trip")
at = datetime(2026, 11, 29, 10, 0, 0, tzinfo=timezone.utc)
records = [
    inventory.CheckpointRecord(
        step=step, attempt=1, stable=True, saved_at=at,
        pfs=inventory.TierCopy(complete=True, verified=True),
        local=(inventory.NodeCopy(node="node-a", complete=True, verified=True),),
    )
    for step in (100, 110, 120)
]
report = trip.TripReport(
    attempt=1, node="node-a", step=132, tripped_at=at, signal="LossSpike",
    anomaly_class="BadBatch", evidence="loss 5.10 is 2.32x its baseline 2.20 for 4 steps",
    value=5.1, threshold=3.52, onset_step=129, last_good_step=128, firing=("LossSpike",),
    inventory=inventory.compact_inventory(records, "node-a"),
    lineage_path="/stabletrain/pfs/lineage/attempt-1/spike-129.jsonl",
)
status = channel.AgentStatus(
    attempt=1, node="node-a", node_rank=0, updated_at=at, step=132, loss=5.1,
    loss_baseline=2.2, grad_norm=1.3, grad_norm_baseline=1.1, lr_scale=1.0,
    tokens_per_second=51234.5, applied_generation=2,
    firing=(channel.FindingReport(
        signal="LossSpike", anomaly_class="BadBatch", value=5.1, threshold=3.52,
        onset_step=129, consecutive=4, sustained=True, evidence="loss 5.10 is 2.32x",
    ),),
    inventory=tuple(records), latest_trip=report,
)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / "status.json").write_text(status.model_dump_json(indent=1) + "\n")
(out / "termination-message.json").write_text(trip.render_termination_message(report) + "\n")
schema = directives.Directives.model_json_schema(by_alias=True)
(out / "directives.schema.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
defaults = directives.Directives(generation=1, attempt=0).model_dump(mode="json", by_alias=True)
(out / "directives-defaults.json").write_text(json.dumps(defaults, indent=1) + "\n")
"""


def record(commit: str) -> Path:
    """Write the three files of `commit`'s agent; return their directory."""
    archive, where = _archive(commit)
    short = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=7", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    target = OUT / f"agent-{short}"
    with tempfile.TemporaryDirectory(prefix="stabletrain-skew-") as scratch:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(scratch, filter="data")
        package = Path(scratch, where)
        if package.name == "contract":  # the old layout: only the agent's subpackage
            (package.parent / "__init__.py").write_text("")
            package = package.parent
        # This checkout's own packages (an editable install puts them on the path) must
        # not stand in for the commit's.
        prelude = (
            f"import sys; sys.path = [p for p in sys.path if p not in {SOURCE_ROOTS!r}]\n"
            f"sys.path.insert(0, {str(package.parent)!r})\n"
        )
        subprocess.run([sys.executable, "-I", "-c", prelude + BUILDER, str(target)], check=True)
    return target


def _archive(commit: str) -> tuple[bytes, str]:
    """The tar of `commit`'s contract and the path it lies under."""
    for where in CONTRACTS:
        done = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, where],
            check=False,
            capture_output=True,
        )
        if done.returncode == 0:
            return done.stdout, where
    raise SystemExit(f"{commit} has no contract package under any of {CONTRACTS}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(record(name))
