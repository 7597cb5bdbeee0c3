"""launch/docker/'s images and their locks, without building them: no test machine is sure to
have a container daemon or the package index, so the Dockerfiles, the locks
(constraints-tpu.txt, constraints-cuda12.txt) and the JobSets that run the images are checked by
reading them.

What reading can and cannot tell: every package that the image's install line reaches in this
environment (its requirements followed through the installed distributions' metadata, markers
evaluated for this interpreter) must be pinned in the lock, and the packages the lock shares
with constraints.txt must be at the tested versions. What is not installed here (libtpu's
siblings on CUDA: jax-cuda12-plugin and the nvidia-* wheels) is checked by name only, one level
deep. The full check is pip's own resolver in dry-run mode against each lock
(launch/docker/lock.py --check), which needs the index and ~1 min per image: the last test runs
it when ELECTRA_JAX_RESOLVE_LOCKS=1 is set.
"""

import importlib.metadata
import importlib.util
import os
import re
import runpy
from unittest import mock

import pytest
import yaml
from packaging.requirements import Requirement

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("lock", ROOT / "launch" / "docker" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

JOBSETS = {"tpu": "tpu_jobset.yaml", "cuda12": "gpu_jobset.yaml"}


def _setup():
    """setup()'s arguments in this tree's setup.py (the installed electra_jax may be another
    checkout's)."""
    got = {}
    with mock.patch("setuptools.setup", lambda **kwargs: got.update(kwargs)):
        runpy.run_path(str(ROOT / "setup.py"))
    return got


def _build_tag(image):
    """The tag of the `docker build` command that the Dockerfile's header gives."""
    header = lock.dockerfile(image).read_text()
    [tag] = re.findall(r"^#\s+docker build .* -t (\S+) \.$", header, re.M)
    return tag


@pytest.mark.parametrize("image", lock.IMAGES)
def test_dockerfile_installs_the_repository_with_its_lock(image):
    text = lock.dockerfile(image).read_text()
    # The Python the locks were resolved for, and one setup.py accepts.
    [base] = re.findall(r"^FROM (\S+)$", text, re.M)
    assert base.startswith("python:3.11-"), base
    assert _setup()["python_requires"] == ">=3.11"
    # The repository copied into the working directory, so that --config=configs/... resolves.
    [workdir] = re.findall(r"^WORKDIR (\S+)$", text, re.M)
    assert re.search(r"^COPY \. \.$", text, re.M) and workdir.startswith("/")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") :].count("*") == 1
    assert {"!electra_jax", "!configs", "!setup.py", "!constraints*.txt"} <= set(ignored)
    constraints, requirements = lock.install_line(image)
    assert constraints == f"constraints-{image}.txt"
    [project] = [r for r in requirements if r.startswith(".[")]
    assert image in project[2:-1].split(","), project
    pins = lock.read_lock(ROOT / constraints)
    # The tested versions wherever the suite's own freeze names the package.
    tested = lock.read_lock(ROOT / "constraints.txt")
    assert {n: pins[n] for n in tested if n in pins} == {n: tested[n] for n in tested if n in pins}
    accelerator = {"tpu": ["libtpu"], "cuda12": ["jax-cuda12-plugin", "nvidia-cudnn-cu12"]}
    assert set(accelerator[image]) <= set(pins)


def _reached(requirements):
    """{canonical name: installed version or None} of every distribution the requirements reach
    through the installed distributions' metadata; a distribution not installed is named, not
    followed."""
    reached, todo = {}, [Requirement(r) for r in requirements]
    seen = set()
    while todo:
        req = todo.pop()
        name = lock.canonical(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            reached.setdefault(name, None)
            continue
        reached[name] = dist.version
        for line in dist.requires or []:
            dep = Requirement(line)
            wanted = [{"extra": e} for e in ("", *req.extras)]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in wanted):
                todo.append(dep)
    return reached


@pytest.mark.parametrize("image", lock.IMAGES)
def test_lock_pins_every_package_the_install_reaches_here(image):
    constraints, requirements = lock.install_line(image)
    pins = lock.read_lock(ROOT / constraints)
    # '.[extras]' is setup.py's requirements and those of the extras.
    project = [r for r in requirements if r.startswith(".[")][0]
    setup = _setup()
    own = list(setup["install_requires"])
    for extra in project[2:-1].split(","):
        own += setup["extras_require"][extra]
    reached = _reached(own + [r for r in requirements if r != project])
    assert sorted(set(reached) - set(pins)) == []


@pytest.mark.parametrize("image", lock.IMAGES)
def test_jobset_runs_the_dockerfiles_tag(image):
    tag = _build_tag(image)
    # The tag names the package's version and the accelerator: a new release is a new tag, never
    # an image replaced under the same one.
    assert tag.endswith(f"/electra_jax:{_setup()['version']}-{image}"), tag
    docs = yaml.safe_load_all((ROOT / "launch" / "k8s" / JOBSETS[image]).read_text())
    [jobset] = [d for d in docs if d["kind"] == "JobSet"]
    [replicated] = jobset["spec"]["replicatedJobs"]
    [container] = replicated["template"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == tag
    # docs/scaling.md builds and pushes the same tag.
    scaling = (ROOT / "docs" / "scaling.md").read_text()
    assert f"-f launch/docker/{image}.Dockerfile -t {tag} ." in scaling
    assert f"docker push {tag}" in scaling


def test_lock_tool_refuses_bad_arguments(capsys):
    assert lock.main(["--write"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.skipif(
    os.environ.get("ELECTRA_JAX_RESOLVE_LOCKS") != "1",
    reason="needs the package index and ~1 min per image: ELECTRA_JAX_RESOLVE_LOCKS=1",
)
@pytest.mark.parametrize("image", lock.IMAGES)
def test_pip_resolver_finds_nothing_unpinned(image):
    assert lock.unpinned(image) == []
