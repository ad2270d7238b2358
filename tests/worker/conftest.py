import threading

import pytest

from tests.conftest_docker import docker_client, test_engine_image  # noqa: F401


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    """The real engine agent, ticking on a thread of the test process."""
    from appliance.runtime.follower import FollowOptions
    from web.agent.controller import EngineAgent

    engine_agent = EngineAgent(agent_id="test-agent",
                               follow_options=FollowOptions(ready_timeout_s=90))
    stop = threading.Event()
    thread = threading.Thread(target=engine_agent.run, args=(stop, 0.2), daemon=True)
    thread.start()
    yield engine_agent
    stop.set()
    thread.join(timeout=20)
