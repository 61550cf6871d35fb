"""The deploy tier's shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.image_install import ImageInstall


@pytest.fixture(scope="session")
def image_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageInstall]:
    """The image's install steps, started now and left running; removed (venv and all) at the end."""
    install = ImageInstall(tmp_path_factory.mktemp("image-install"))
    yield install
    install.remove()


@pytest.fixture(scope="session", autouse=True)
def image_install_starts_early(request: pytest.FixtureRequest) -> None:
    """Start the image install at the first deploy test when a selected test will check it."""
    if any("image_install" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("image_install")
