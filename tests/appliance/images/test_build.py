"""Engine image builds against the real Docker engine: a tiny recipe on the local base
image, with a local git repository as the SGLang source and one patch."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.images.build import BuildCancelled, BuildEvent, BuildFailed, build_image
from appliance.images.plan import BuildPlan, plan_build
from tests.site_recipes import SLOW_EXTRAS, engine_source_repo, write_recipe

pytestmark = pytest.mark.docker

BASE_IMAGE = os.environ.get("APPLIANCE_BASE_IMAGE", "appliance-base:bookworm")
ORIGINAL = 'VERIFY_WIDTH = "block"\n'
PATCHED = 'VERIFY_WIDTH = "budget+1"\n'


def make_recipe(name: str, repo: Path, patches: list[str], recipe_dir: Path, **extra: Any) -> Any:
    """A Recipe from appliance.engine.recipes, written and loaded the way users write them."""
    from appliance.engine import recipes

    source = recipes.SGLangSource(pip=None, git=str(repo), ref="main")
    fields: dict[str, Any] = {
        "name": name, "base_image": BASE_IMAGE, "sglang": source, "patches": patches,
        "pip_extras": [], "env": {"APPLIANCE_TEST": "1"},
        "build_args": {"SGLANG_INSTALL_DEPS": "0"}, "path": recipe_dir / f"{name}.yaml",
    }
    fields.update(extra)
    names = {f.name for f in dataclasses.fields(recipes.Recipe)}
    return recipes.Recipe(**{k: v for k, v in fields.items() if k in names})


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:  # no daemon: the only reason these tests skip
        pytest.skip(f"no Docker daemon: {exc}")
    c.images.get(BASE_IMAGE)  # fails loudly: make it with docker/base/make-base-image.sh
    yield c
    c.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local git 'sglang' (python/sglang/...) and two patches: one fits, one is stale."""
    root = tmp_path_factory.mktemp("build")
    repo = root / "sglang"
    pkg = repo / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (pkg / "graph.py").write_text("# capture widths\n" + ORIGINAL + "DRAFT_WIDTH = 8\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny sglang")
    (pkg / "graph.py").write_text("# capture widths\n" + PATCHED + "DRAFT_WIDTH = 8\n")
    good = subprocess.run(["git", "-C", str(repo), "diff"], capture_output=True, check=True)
    (root / "width.patch").write_bytes(good.stdout)
    git(repo, "checkout", "-q", "--", ".")
    stale = good.stdout.replace(b"DRAFT_WIDTH = 8", b"DRAFT_WIDTH = 16")
    (root / "stale.patch").write_bytes(stale)
    return root


def build(plan: BuildPlan, client: Any, **kwargs: Any) -> tuple[Any, list[BuildEvent]]:
    events: list[BuildEvent] = []
    result = build_image(plan, client=client, on_event=events.append, **kwargs)
    return result, events


def remove_image(client: Any, tag: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        # noprune: the untagged layers under it are other builds' cache, maybe in use now
        client.images.remove(tag, force=True, noprune=True)


@pytest.fixture(scope="module")
def built(client: Any, workdir: Path) -> Iterator[tuple[BuildPlan, Any, list[BuildEvent]]]:
    recipe = make_recipe("tiny", workdir / "sglang", ["width.patch"], workdir)
    plan = plan_build(recipe, gpucheck=None)
    remove_image(client, plan.tag)
    result, events = build(plan, client)
    yield plan, result, events
    remove_image(client, plan.tag)


def test_it_streams_every_step_in_order_and_the_image_runs_the_patched_source(
    client: Any, built: tuple[BuildPlan, Any, list[BuildEvent]]
) -> None:
    plan, result, events = built
    steps = [e for e in events if e.kind == "build_step"]
    assert not result.cached
    assert [e.step for e in steps] == list(range(1, len(steps) + 1))
    assert {e.total for e in steps} == {len(steps)}
    assert any("applied width.patch" in e.text for e in events if e.kind == "build_log")
    code = "import sglang.graph as g; print(g.VERIFY_WIDTH)"
    out = client.containers.run(plan.tag, ["python3", "-c", code], remove=True)
    assert out.decode().strip() == "budget+1"


def test_a_second_build_is_a_cache_hit_in_under_a_second_without_building(
    client: Any, built: tuple[BuildPlan, Any, list[BuildEvent]], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = built[0]

    def no_build(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a cached image must not be built again")

    monkeypatch.setattr(client.api, "build", no_build)
    result, events = build(plan, client)
    assert result.cached
    assert result.elapsed_s < 1.0
    assert [e.kind for e in events] == ["cache_hit"]


def test_no_cache_rebuilds_an_existing_image(
    client: Any, built: tuple[BuildPlan, Any, list[BuildEvent]]
) -> None:
    plan = built[0]
    result, events = build(plan, client, no_cache=True)
    assert not result.cached
    assert any(e.kind == "build_step" for e in events)
    assert not any(e.kind == "cache_hit" for e in events)
    assert not any("Using cache" in e.text for e in events)


def test_a_stale_patch_fails_the_build_naming_the_patch_the_file_and_the_hunk(
    client: Any, workdir: Path
) -> None:
    recipe = make_recipe("tiny-stale", workdir / "sglang", ["stale.patch"], workdir)
    plan = plan_build(recipe, gpucheck=None)
    with pytest.raises(BuildFailed) as failed:
        build(plan, client)
    err = failed.value
    assert (err.patch, err.file, err.hunk) == ("stale.patch", "python/sglang/graph.py", 1)
    assert "stale.patch" in str(err) and "hunk #1" in str(err)
    assert err.step is not None and "apply_patches.py" in (err.step_text or "")
    assert any("FAILED" in line for line in err.last_output_lines)


def test_cancelling_a_build_stops_it_and_leaves_no_build_container(
    client: Any, workdir: Path
) -> None:
    recipe = make_recipe("tiny-slow", workdir / "sglang", [], workdir)
    plan = plan_build(recipe, gpucheck=None, extra_steps=["RUN echo slow-step && sleep 300"])
    cancel = threading.Event()

    def on_event(event: BuildEvent) -> None:
        if "slow-step" in event.text and event.kind == "build_log":
            cancel.set()

    started = time.monotonic()
    # The steps before the slow one are the layers this module's builds made already (the
    # slow step never ends, so it is never a layer to reuse): the cancel meets it in seconds.
    with pytest.raises(BuildCancelled) as cancelled:
        build_image(plan, client=client, cancel=cancel, on_event=on_event)
    assert time.monotonic() - started < 120
    running = cancelled.value.container_ids
    assert running, "the slow step's container was seen"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = client.containers.list(ignore_removed=True, filters={"id": running[-1]})
        if not left:
            break
        time.sleep(0.5)
    assert client.containers.list(ignore_removed=True, filters={"id": running[-1]}) == []
    with pytest.raises(Exception):  # noqa: B017 - docker.errors.ImageNotFound
        client.images.get(plan.tag)


def test_the_tag_changes_when_a_patch_file_changes(workdir: Path, tmp_path: Path) -> None:
    patch = tmp_path / "width.patch"
    patch.write_bytes((workdir / "width.patch").read_bytes())
    recipe = make_recipe("tiny", workdir / "sglang", [str(patch)], workdir)
    before = plan_build(recipe, gpucheck=None).tag
    assert plan_build(recipe, gpucheck=None).tag == before
    patch.write_bytes(patch.read_bytes().replace(b"budget+1", b"budget+2"))
    after = plan_build(recipe, gpucheck=None).tag
    assert after != before
    assert after.startswith("appliance-engine:tiny-")


def test_the_ca_bundle_reaches_the_download_steps_but_not_the_image_filesystem(
    client: Any, workdir: Path, tmp_path: Path
) -> None:
    marker = "APPLIANCE-TEST-CA-MARKER-7f3a"
    pem = tmp_path / "ca.pem"
    pem.write_text(f"-----BEGIN CERTIFICATE-----\n{marker}\n-----END CERTIFICATE-----\n")
    recipe = make_recipe("tiny-ca", workdir / "sglang", [], workdir)
    plan = plan_build(recipe, gpucheck=None, ca_bundle=pem)
    assert plan.tag == plan_build(recipe, gpucheck=None).tag  # the bundle is not content
    try:
        _, events = build(plan, client, no_cache=True)
        assert any("CA bundle in use" in e.text for e in events)
        grep = ["grep", "-rl", marker, "/opt", "/tmp", "/etc", "/root", "/usr/local"]
        found = client.containers.run(plan.tag, grep, remove=True, stderr=False)
        assert found.decode().strip() == ""
    except Exception as exc:  # grep exits 1 when nothing matches: that is the pass case
        import docker.errors

        if not isinstance(exc, docker.errors.ContainerError) or exc.exit_status != 1:
            raise
    image = client.images.get(plan.tag)
    assert not any(marker in v for v in image.attrs["Config"].get("Env") or [])
    for entry in image.history():
        created_by = entry.get("CreatedBy", "")
        if marker in created_by:  # only as the recorded build arg (see appliance/images/plan.py)
            assert "APPLIANCE_CA_PEM_0=" in created_by
    remove_image(client, plan.tag)


def test_the_entrypoint_runs_the_gpu_check_first_and_stops_when_it_fails(
    client: Any, workdir: Path, tmp_path: Path
) -> None:
    check = tmp_path / "gpucheck.py"
    check.write_text("import sys\nprint('fake check', sys.argv[1:])\nsys.exit(3)\n")
    recipe = make_recipe("tiny-check", workdir / "sglang", [], workdir)
    plan = plan_build(recipe, gpucheck=check)
    build(plan, client)
    container = client.containers.run(
        plan.tag, ["python3", "-c", "print('engine started')"], detach=True,
        environment={"APPLIANCE_GPU_CHECK": "1", "APPLIANCE_GPU_CHECK_ARGS": '["--tp", "1"]'},
    )
    try:
        status = container.wait(timeout=60)
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 3
    assert "fake check ['--stream', '--tp', '1']" in logs
    assert "appliance: GPU self-check end rc=3" in logs
    assert "engine started" not in logs
    out = client.containers.run(plan.tag, ["python3", "-c", "print('engine started')"],
                                remove=True)
    assert out.decode().strip() == "engine started"
    remove_image(client, plan.tag)


# ------------------------------------------------------------ `appliance build` command


def appliance(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=Path(__file__).resolve().parents[3])


def test_the_build_command_streams_steps_then_skips_a_built_image_unless_no_cache(
    client: Any, workdir: Path
) -> None:
    recipe = write_recipe(workdir, "cli-tiny", workdir / "sglang", patches=["width.patch"],
                          base_image=BASE_IMAGE)
    planned = appliance("build", str(recipe), "--plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    tag = json.loads(planned.stdout)["tag"]
    remove_image(client, tag)
    try:
        first = appliance("build", str(recipe), "--text")
        assert first.returncode == 0, first.stdout + first.stderr
        steps = [line for line in first.stdout.splitlines() if line.startswith("step ")]
        total = len(steps)
        assert steps and [s.split(":")[0] for s in steps] == [
            f"step {i}/{total}" for i in range(1, total + 1)]
        assert "applied width.patch" in first.stdout
        assert first.stdout.rstrip().splitlines()[-1].startswith(f"built {tag}")

        again = appliance("build", str(recipe), "--text")
        assert again.returncode == 0
        assert again.stdout.strip() == f"image {tag} already built; skipping the build"

        forced = appliance("build", str(recipe), "--no-cache")
        kinds = [json.loads(line)["kind"] for line in forced.stdout.splitlines()]
        assert forced.returncode == 0 and "cache_hit" not in kinds
        assert kinds.count("build_step") == total and kinds[-1] == "built"
        planned = appliance("build", str(recipe), "--plan", "--text").stdout.splitlines()
        assert planned[0] == f"{tag} (built)"
        # The plan shows the values it builds with, not only their names.
        assert "  base_image: appliance-base:bookworm" in planned
        assert any(line.startswith("  base_image_id: sha256:") for line in planned)
        assert any(line.startswith("  source: ") and "'ref': " in line for line in planned)
    finally:
        remove_image(client, tag)


def test_the_build_command_names_a_patch_that_does_not_apply_and_exits_one(
    client: Any, workdir: Path
) -> None:
    recipe = write_recipe(workdir, "cli-stale", workdir / "sglang", patches=["stale.patch"],
                          base_image=BASE_IMAGE)
    done = appliance("build", str(recipe), "--text")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "build failed: patch stale.patch does not apply: file python/sglang/graph.py, " \
           "hunk #1" in done.stdout


def test_ctrl_c_cancels_the_build_command_and_its_running_step(
    client: Any, workdir: Path, tmp_path: Path
) -> None:
    import signal
    import sys

    repo = engine_source_repo(tmp_path, slow_extra=True)
    recipe = write_recipe(tmp_path, "cli-slow", repo, extras=SLOW_EXTRAS, base_image=BASE_IMAGE)
    # SIGINT as a terminal delivers it: a suite started in the background (`./test &`)
    # ignores SIGINT, and a child inherits that, so Python would never see the Ctrl-C.
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "build", str(recipe), "--text"],
                            stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3],
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def step_containers() -> list[Any]:
        return [c for c in client.api.containers(all=True)  # one call: no per-container race
                if "install-sglang" in c.get("Command", "")]

    try:
        deadline = time.monotonic() + 120
        while not step_containers():
            assert proc.poll() is None and time.monotonic() < deadline, "no slow step started"
            time.sleep(0.3)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert out.rstrip().splitlines()[-1] == "build cancelled"
    deadline = time.monotonic() + 30
    while step_containers() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not step_containers()


def test_a_whole_system_ca_bundle_is_split_under_the_kernels_per_variable_limit() -> None:
    from appliance.images.plan import CA_CHUNK_BYTES, BuildError, ca_buildargs

    pem = "-----BEGIN CERTIFICATE-----\n" + "A" * 64 + "\n-----END CERTIFICATE-----\n"
    bundle = pem * 2000  # ~230 KiB, like Debian's ca-certificates.crt
    args = ca_buildargs(bundle)
    assert list(args) == ["APPLIANCE_CA_PEM_0", "APPLIANCE_CA_PEM_1", "APPLIANCE_CA_PEM_2"]
    assert all(len(v.encode()) <= CA_CHUNK_BYTES < 128 * 1024 for v in args.values())
    assert "".join(args.values()) == bundle
    with pytest.raises(BuildError, match="pass only the proxy's CA certificate"):
        ca_buildargs(pem * 5000)
