"""Plain-JSON access to the API server, the way a kubelet sees objects: as documents.

The node works on pod specs as the API returns them (camelCase dicts), which keeps every field
the kubelet reads visible without a typed model in between, and keeps the generated client's
model conversion (slow, and lossy for unknown fields) out of a loop that runs several times a
second.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from kubernetes import client

Json = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer, with the status code and the server's own message."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status


class RawApi:
    """GET/POST/PATCH/DELETE of JSON documents through an authenticated ApiClient."""

    def __init__(self, api_client: client.ApiClient, timeout: float = 10.0) -> None:
        self._api_client = api_client
        self._host = api_client.configuration.host
        self._timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Json:
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        response = self._api_client.rest_client.request(  # type: ignore[no-untyped-call]
            method, url, headers=headers, body=body, _request_timeout=self._timeout
        )
        data = response.read()
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, text)
        parsed: Json = json.loads(text) if text else {}
        return parsed

    def get(self, path: str, query: dict[str, str] | None = None) -> Json | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def items(self, path: str, query: dict[str, str] | None = None) -> list[Json]:
        listed = self.request("GET", path, query=query)
        found: list[Json] = listed.get("items") or []
        return found

    def post(self, path: str, body: Json) -> Json:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Json) -> Json:
        return self.request("PATCH", path, body, content_type=MERGE_PATCH)

    def delete(self, path: str, body: Json | None = None) -> bool:
        """True when this call deleted it (or started to), False when it was already gone."""
        try:
            self.request("DELETE", path, body)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"
