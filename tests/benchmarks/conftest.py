from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401
from tests.e2e.conftest import page  # noqa: F401
