"""The vocabulary of one rlserve installation on Kubernetes (k8s/base): object names and the
annotations through which ``rlserve rollout`` records what it did."""

from __future__ import annotations

from dataclasses import dataclass

ACTIVE_COLOR = "rlserve.io/active-color"  # on the production Service
PREVIOUS_COLOR = "rlserve.io/previous-color"  # on the production Service
ROLLBACK_UNTIL = "rlserve.io/rollback-until"  # on the production Service, UTC
RESTORE_MIN = "rlserve.io/restore-min-replicas"  # on an HPA whose floor promote raised
MODEL_VERSION = "rlserve.io/model-version"  # on a Deployment and its pod template
VERSION_POLICY_ENV = "RLSERVE_VERSION_POLICY"
CONTAINER = "server"


@dataclass(frozen=True)
class Names:
    """The objects of one rlserve installation (k8s/base)."""

    namespace: str = "rlserve"
    service: str = "rlserve"
    preview: str = "rlserve-preview"
    app: str = "rlserve"

    def workload(self, color: str) -> str:
        """The Deployment and the HorizontalPodAutoscaler of a color share this name."""
        return f"{self.app}-{color}"

    def proxy(self, service: str, path: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{service}:http/proxy{path}"


def annotation(key: str) -> str:
    """The JSONPath of an annotation (dots in its key escaped)."""
    return "{.metadata.annotations." + key.replace(".", "\\.") + "}"
