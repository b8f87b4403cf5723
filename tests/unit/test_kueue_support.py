"""The Kueue test support's pure parts: the pin agrees with the build, and the webhook
manifests are pointed at the manager on loopback."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from support.kueue import KUEUE_PIN, webhook_configurations

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service:
      name: webhook-service
      path: /mutate-kueue-x-k8s-io-v1beta2-workload
  name: mworkload.kb.io
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service:
      name: webhook-service
      path: /validate-kueue-x-k8s-io-v1beta2-workload
  name: vworkload.kb.io
"""


def test_the_pin_is_the_version_the_build_makes() -> None:
    script = (REPO / "hack" / "k8s-bins.sh").read_text()
    found = re.search(r"^KUEUE_VERSION=\$\{KUEUE_VERSION:-(v[0-9.]+)\}$", script, re.MULTILINE)
    assert found is not None
    assert found.group(1) == KUEUE_PIN


def test_webhooks_point_at_loopback_with_the_test_ca() -> None:
    mutating, validating = webhook_configurations(MANIFESTS, 9443, b"PEM", "abc")
    assert mutating["metadata"]["name"] == "kueue-abc-mutating-webhook-configuration"
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    (hook,) = validating["webhooks"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-kueue-x-k8s-io-v1beta2-workload",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
