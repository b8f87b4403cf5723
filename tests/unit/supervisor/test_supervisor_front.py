"""The pod's agent port as the supervisor serves it, over real HTTP on 127.0.0.1: the agent's
status passed through with the supervisor's report, the supervisor's own status while no
agent answers, the readiness probe, and orders that need the job's token."""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stabletrain_agent.endpoint.http_server import KeepAliveWSGIServer
from stabletrain_agent.supervisor.agent_link import AgentLink
from stabletrain_agent.supervisor.attempts import Attempts, AttemptSettings
from stabletrain_agent.supervisor.front import Front
from stabletrain_agent.supervisor.launch import ColdLauncher
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.own_status import TierScan
from stabletrain_agent.supervisor.processes import Reaper
from stabletrain_contract import env
from stabletrain_contract.channel import AgentStatus, parse_agent_status
from stabletrain_contract.directives import Directives

TOKEN = "t0ken"


class _Agent(BaseHTTPRequestHandler):
    """The training agent behind the supervisor: its status endpoint, nothing else."""

    def do_GET(self) -> None:
        status = AgentStatus(
            attempt=0, node="node-a", node_rank=0, updated_at=datetime.now(UTC), step=12,
            lr_scale=1.0, applied_generation=1,
        )  # fmt: skip
        body = status.model_dump_json().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, ThreadingHTTPServer]]:
    agent = ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    local_port = agent.server_address[1]
    environment = {
        **os.environ,
        env.ATTEMPT: "0",
        env.NODE_NAME: "node-a",
        env.NODE_RANK: "0",
        env.LOCAL_CHECKPOINT_DIR: str(tmp_path / "local"),
        env.PFS_CHECKPOINT_DIR: str(tmp_path / "pfs"),
    }
    settings = AttemptSettings(
        argv=(sys.executable, "-c", "import time; time.sleep(600)"),
        base_env=environment,
        local_agent_port=local_port,
        run_dir=tmp_path / "run",
        termination_path=tmp_path / "termination-log",
        default_grace=5.0,
    )
    reaper = Reaper(everything=False)
    tail = Tail(4096)
    attempts = Attempts(settings, ColdLauncher(tail), reaper, tail)
    attempts.start_first()
    front = Front(attempts, AgentLink(local_port), environment, TOKEN, TierScan(environment))
    server = KeepAliveWSGIServer(("127.0.0.1", 0), front.app())
    server.serve_in_background("front")
    try:
        yield server.server_address[1], agent
    finally:
        server.stop()
        agent.server_close()
        attempts.terminate(0.0)
        reaper.close()


def request(port: int, method: str, path: str, body: object = None, token: str | None = TOKEN):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


def test_the_status_is_the_agents_with_the_supervisors_report_or_its_own(
    served: tuple[int, ThreadingHTTPServer],
) -> None:
    port, agent = served
    serving = threading.Thread(target=agent.serve_forever, daemon=True)
    serving.start()
    code, document = request(port, "GET", "/v1/status")
    assert code == 200
    status = parse_agent_status(json.dumps(document))
    assert status.step == 12
    assert status.supervisor is not None
    assert (status.supervisor.agent_answered, status.supervisor.state) == (True, "Running")
    agent.shutdown()
    code, document = request(port, "GET", "/v1/status")
    own = parse_agent_status(json.dumps(document))
    assert (own.step, own.heartbeat) == (None, None), "nothing of the training process"
    assert own.supervisor is not None
    assert not own.supervisor.agent_answered
    assert (own.attempt, own.node, own.inventory) == (0, "node-a", ())
    assert request(port, "GET", "/v1/ready")[0] == 200


def test_orders_need_the_jobs_token_and_a_valid_body(
    served: tuple[int, ThreadingHTTPServer],
) -> None:
    port, _ = served
    code, ack = request(port, "PUT", "/v1/supervisor/stop", {"attempt": 0}, token="wrong")
    assert (code, ack["accepted"]) == (401, False)
    assert "Bearer" in ack["message"]
    code, ack = request(port, "PUT", "/v1/supervisor/stop", {"attempt": "zero"})
    assert code == 400
    assert "attempt" in ack["message"], "the field is named"
    order = {
        "directives": Directives(generation=2, attempt=1).model_dump(mode="json"),
        "rendezvousEndpoint": "job-a0-0.job.ns.svc:29400",
        "rendezvousId": "job-1",
        "masterAddr": "job-a0-0.job.ns.svc",
        "graceSeconds": 1,
    }
    code, ack = request(port, "PUT", "/v1/supervisor/start", order)
    assert (code, ack["accepted"]) == (200, True)
    code, ack = request(port, "PUT", "/v1/supervisor/stop", {"attempt": 0})
    assert (code, ack["accepted"]) == (409, False), "fenced: attempt 1 was ordered"
    assert request(port, "GET", "/v1/nowhere")[0] == 404
