from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401
