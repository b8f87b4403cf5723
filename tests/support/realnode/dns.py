"""Cluster DNS for the real node: the A records CoreDNS would serve, read from the API.

A real cluster runs CoreDNS; building it here would cost another large Go build for two kinds
of names the tests need: a pod's `<hostname>.<subdomain>.<namespace>.svc[.cluster.local]`
(torchrun's rendezvous address, under the job's headless Service) and a Service's
`<name>.<namespace>.svc[.cluster.local]`. Anything else is NXDOMAIN, at once, so a resolver
walking its search path never waits. Run inside the node's network namespace:

    python -m support.realnode.dns ADDRESS SERVER CA CERT KEY
"""

from __future__ import annotations

import json
import socketserver
import ssl
import struct
import sys
import urllib.request
from typing import Any

_A, _AAAA, _IN = 1, 28, 1
_NOERROR, _NXDOMAIN, _SERVFAIL = 0, 3, 2
_DOMAIN_SUFFIX = ".cluster.local"


class ApiReader:
    def __init__(self, server: str, ca: str, cert: str, key: str) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=ca)
        self.context.load_cert_chain(cert, key)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.server + path, timeout=3, context=self.context) as r:
            return json.load(r)

    def lookup(self, name: str) -> str | None:
        """The IPv4 address of a cluster name, or None when no such name exists."""
        name = name.lower().rstrip(".")
        name = name.removesuffix(_DOMAIN_SUFFIX)
        if not name.endswith(".svc"):
            return None
        parts = name.removesuffix(".svc").split(".")
        if len(parts) == 2:
            service, namespace = parts
            try:
                found = self.get(f"/api/v1/namespaces/{namespace}/services/{service}")
            except OSError:
                return None
            ip = found.get("spec", {}).get("clusterIP")
            return ip if ip and ip != "None" else None
        if len(parts) == 3:
            hostname, subdomain, namespace = parts
            pods = self.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            for pod in pods:
                spec, status = pod.get("spec", {}), pod.get("status", {})
                if spec.get("hostname") == hostname and spec.get("subdomain") == subdomain:
                    ip = status.get("podIP")
                    if isinstance(ip, str) and ip:
                        return ip
        return None


def _question(packet: bytes) -> tuple[str, int, int]:
    """The first question's name, type, and the offset just past it."""
    labels, offset = [], 12
    while (length := packet[offset]) != 0:
        labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    qtype = struct.unpack("!H", packet[offset + 1 : offset + 3])[0]
    return ".".join(labels), qtype, offset + 5


def answer(packet: bytes, api: ApiReader) -> bytes:
    (ident,) = struct.unpack("!H", packet[:2])
    name, qtype, end = _question(packet)
    try:
        address = api.lookup(name)
        rcode = _NOERROR if address else _NXDOMAIN
    except OSError:
        address, rcode = None, _SERVFAIL
    records = b""
    if address and qtype == _A:
        rdata = bytes(int(octet) for octet in address.split("."))
        records = struct.pack("!HHHIH", 0xC00C, _A, _IN, 5, 4) + rdata
    flags = 0x8180 | rcode  # a response, recursion desired and available
    header = struct.pack("!HHHHHH", ident, flags, 1, 1 if records else 0, 0, 0)
    return header + packet[12:end] + records


def main(argv: list[str]) -> None:
    address, server, ca, cert, key = argv
    api = ApiReader(server, ca, cert, key)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            try:
                sock.sendto(answer(data, api), self.client_address)
            except (IndexError, struct.error, UnicodeError) as error:
                print(f"dropped a malformed query: {error}", file=sys.stderr, flush=True)

    with socketserver.ThreadingUDPServer((address, 53), Handler) as dns:
        print(f"cluster DNS on {address}:53", flush=True)
        dns.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
