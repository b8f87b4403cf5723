"""The control plane is real: CRDs, schema validation, garbage collection, namespace deletion."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from support.controlplane import ControlPlane

GROUP = "smoke.stabletrain.dev"

CRD = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{GROUP}
spec:
  group: {GROUP}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {{type: integer, minimum: 1}}
"""


def _kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _widget(name: str, size: object) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    }


def test_version_is_the_pinned_release(control_plane: ControlPlane) -> None:
    version = json.loads(_kubectl(control_plane, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.34.4"
    assert control_plane.started_in_seconds < 60


def test_crd_objects_validation_and_namespace_deletion(
    control_plane: ControlPlane, api_client: client.ApiClient
) -> None:
    _kubectl(control_plane, "apply", "-f", "-", stdin=CRD)
    _kubectl(
        control_plane,
        "wait",
        "--for=condition=Established",
        f"crd/widgets.{GROUP}",
        "--timeout=30s",
    )
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    namespace = f"smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))

    custom.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", _widget("a", 3))
    read = custom.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "a")
    assert read["spec"] == {"size": 3}

    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", _widget("b", 0))
    assert rejected.value.status == 422
    assert "spec.size" in str(rejected.value.body)

    # A ConfigMap owned by another is garbage-collected by kube-controller-manager.
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    reference = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="owned", owner_references=[reference])
        ),
    )
    core.delete_namespaced_config_map("owner", namespace)
    _wait_gone(lambda: core.read_namespaced_config_map("owned", namespace), timeout=30)

    core.delete_namespace(namespace)
    _wait_gone(lambda: core.read_namespace(namespace), timeout=60)


def _wait_gone(read: object, timeout: float) -> None:
    assert callable(read)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            read()
        except ApiException as error:
            if error.status == 404:
                return
            raise
        time.sleep(0.2)
    pytest.fail(f"still present after {timeout} s")
