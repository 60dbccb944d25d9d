from __future__ import annotations

import pytest

from tests.unit.shipping.chart import Manifest, find_helm, render


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()


@pytest.fixture(scope="session")
def default_manifests(helm: str) -> list[Manifest]:
    return render(helm)


@pytest.fixture(scope="session")
def namespaced_manifests(helm: str) -> list[Manifest]:
    return render(helm, "watchNamespaces={team-a,team-b}")
