"""The real node's cluster DNS: the names it answers, the ones it refuses at once, and the
wire format a resolver reads (one A record, or NXDOMAIN so the search path moves on)."""

from __future__ import annotations

import struct
from typing import Any

from support.realnode.dns import ApiReader, answer

PODS = {
    "items": [
        {"spec": {"hostname": "job-a0-0", "subdomain": "job"}, "status": {"podIP": "10.251.0.7"}},
        {"spec": {"hostname": "job-a0-1", "subdomain": "job"}, "status": {}},
    ]
}


class Objects(ApiReader):
    """The API's answers as fixed objects: the lookup logic is what is under test."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def get(self, path: str) -> Any:
        self.paths.append(path)
        if path == "/api/v1/namespaces/ns/pods":
            return PODS
        if path == "/api/v1/namespaces/default/services/kubernetes":
            return {"spec": {"clusterIP": "10.0.0.1"}}
        raise OSError(f"404 {path}")


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def _decode(packet: bytes) -> tuple[int, int, str | None]:
    ident, flags, _, answers, _, _ = struct.unpack("!HHHHHH", packet[:12])
    address = ".".join(str(b) for b in packet[-4:]) if answers else None
    return ident, flags & 0xF, address


def test_a_pod_is_found_by_hostname_and_subdomain_with_or_without_the_domain() -> None:
    api = Objects()
    assert api.lookup("job-a0-0.job.ns.svc") == "10.251.0.7"
    assert api.lookup("JOB-A0-0.job.ns.svc.cluster.local.") == "10.251.0.7"
    assert api.lookup("job-a0-1.job.ns.svc") is None, "no IP yet: not an address"
    assert api.lookup("kubernetes.default.svc.cluster.local") == "10.0.0.1"
    assert api.lookup("missing.default.svc") is None


def test_search_path_expansions_and_foreign_names_never_reach_the_api() -> None:
    api = Objects()
    assert api.lookup("job-a0-0.job.ns.svc.ns.svc.cluster.local") is None
    assert api.lookup("pypi.org") is None
    assert api.paths == []


def test_the_answer_carries_the_query_id_and_one_a_record() -> None:
    ident, rcode, address = _decode(answer(_query("job-a0-0.job.ns.svc.cluster.local"), Objects()))
    assert (ident, rcode, address) == (0x1234, 0, "10.251.0.7")


def test_unknown_names_are_nxdomain_and_aaaa_of_a_known_name_is_empty() -> None:
    assert _decode(answer(_query("nowhere.example"), Objects()))[1:] == (3, None)
    assert _decode(answer(_query("job-a0-0.job.ns.svc", qtype=28), Objects()))[1:] == (0, None)
