"""A blocking client of the agent's HTTP server, for tests that drive an agent directly.

The operator's own client is async and shares its session with the scrapes
(stabletrain_operator.pod_calls.directive_put, stabletrain_operator.observe.scrape); a test beside a
training process or an exporter on loopback wants a plain call that returns the answer.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from http import HTTPStatus

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    METRICS_HTTP_PATH,
    STATUS_HTTP_PATH,
    AgentStatus,
    bearer,
    parse_agent_status,
    parse_directive_ack,
)
from stabletrain_contract.directives import Directives
from stabletrain_operator.pod_calls.directive_put import AgentUnreachableError, PutResult


def fetch_status(base_url: str, timeout: float = 5.0, *, credential: str = "") -> AgentStatus:
    """GET the agent's status; ContractError names each bad field of a malformed answer.
    With the job's status `credential` the read is the operator's (it hands over)."""
    headers = {AUTHORIZATION_HEADER: bearer(credential)} if credential else {}
    status, body = _request("GET", base_url + STATUS_HTTP_PATH, headers=headers, timeout=timeout)
    if status != HTTPStatus.OK:
        raise ContractError(f"status endpoint answered HTTP {status}: {body[:200]!r}")
    return parse_agent_status(body)


def fetch_metrics(base_url: str, timeout: float = 5.0) -> dict[str, Metric]:
    """Scrape /metrics and parse it back into metric families keyed by name."""
    status, body = _request("GET", base_url + METRICS_HTTP_PATH, timeout=timeout)
    if status != HTTPStatus.OK:
        raise ContractError(f"metrics endpoint answered HTTP {status}: {body[:200]!r}")
    try:
        families = text_string_to_metric_families(body.decode())
        return {family.name: family for family in families}
    except (ValueError, UnicodeDecodeError) as error:
        raise ContractError(f"metrics payload is not Prometheus text format: {error}") from None


def sample_value(families: Mapping[str, Metric], metric: str, **labels: str) -> float | None:
    """The value of one series from ``fetch_metrics``; None when the agent does not export it.

    Counters are looked up by family name (``stabletrain_trips``) and found under their
    ``_total`` sample name, so callers never spell the suffix.
    """
    family = families.get(metric)
    if family is None:
        return None
    for sample in family.samples:
        if sample.name in (metric, metric + "_total") and sample.labels == labels:
            return float(sample.value)
    return None


def put_directives(
    base_url: str, directives: Directives, token: str, timeout: float = 5.0
) -> PutResult:
    """PUT live directives; the answer whatever its status (a refusal carries an ack too)."""
    status, body = _request(
        "PUT",
        base_url + DIRECTIVES_HTTP_PATH,
        timeout=timeout,
        body=directives.to_json().encode(),
        headers={AUTHORIZATION_HEADER: bearer(token), "Content-Type": "application/json"},
    )
    return PutResult(status=status, ack=parse_directive_ack(body))


def _request(
    method: str,
    url: str,
    *,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), bytes(error.read())
    except (urllib.error.URLError, OSError) as error:
        raise AgentUnreachableError(f"agent at {url} did not answer: {error}") from None
