"""The images' locks: constraints-tpu.txt and constraints-cuda12.txt pin every package that the
`pip install` line of launch/docker/<image>.Dockerfile resolves to, so that an image built
today and one built in a year hold the same packages (libtpu and the nvidia-* wheels included,
which jax's extras leave to the newest release).

    python launch/docker/lock.py           # resolve each image's install, write its lock
    python launch/docker/lock.py --check   # resolve against each lock; name what it leaves free

Both run pip's own resolver in dry-run mode (nothing is installed), so they need the package
index. A lock is resolved with constraints.txt, the versions the test suite runs with, so that
every package the two share is the tested one. Resolved for the images' Python (3.11) on Linux
x86_64: run it there (pip resolves environment markers for the interpreter that runs it).
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("tpu", "cuda12")
PYTHON = (3, 11)


def canonical(name: str) -> str:
    """A distribution's name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile(image: str) -> Path:
    return ROOT / "launch" / "docker" / f"{image}.Dockerfile"


def install_line(image: str) -> tuple[str, list[str]]:
    """The constraints file and the requirements of the image's `RUN pip install` line."""
    [line] = re.findall(r"^RUN pip install (.*)$", dockerfile(image).read_text(), re.M)
    args = shlex.split(line)
    constraints = args[args.index("-c") + 1]
    return constraints, [a for a in args if not a.startswith("-") and a != constraints]


def read_lock(path: Path) -> dict[str, str]:
    """NAME==VERSION lines (comments and blank lines aside) as {canonical name: version};
    ValueError naming the file and line of anything else."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pin = re.fullmatch(r"([A-Za-z0-9][\w.-]*)==([\w.+!-]+)", line)
        if pin is None:
            raise ValueError(f"{path.name}:{number}: {line!r} is not NAME==VERSION")
        pins[canonical(pin[1])] = pin[2]
    return pins


def resolve(requirements: list[str], constraints: Path) -> dict[str, str]:
    """What pip would install for `requirements` under `constraints` into an empty environment,
    as {canonical name: version}, the project itself left out."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        command += ["--quiet", "--report", str(report), "-c", str(constraints), *requirements]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"pip's resolver failed:\n{done.stderr.strip()}")
        installs = json.loads(report.read_text())["install"]
    versions = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    versions.pop("electra-jax", None)
    return versions


def unpinned(image: str) -> list[str]:
    """What resolving the image's install against its lock leaves unpinned, or pins that it no
    longer installs; empty when the lock is whole."""
    constraints, requirements = install_line(image)
    pins = read_lock(ROOT / constraints)
    resolved = resolve(requirements, ROOT / constraints)
    problems = [f"{n}=={v} is not pinned" for n, v in sorted(resolved.items()) if n not in pins]
    problems += [f"{n} is pinned but not installed" for n in sorted(set(pins) - set(resolved))]
    return [f"{constraints}: {p}" for p in problems]


def write(image: str) -> Path:
    constraints, requirements = install_line(image)
    resolved = resolve(requirements, ROOT / "constraints.txt")
    header = [
        f"# The lock of launch/docker/{image}.Dockerfile's image: every package pip resolves for",
        f"# {' '.join(requirements)} on Python {'.'.join(map(str, PYTHON))}, Linux x86_64, with",
        "# constraints.txt's versions where it names them. Written by launch/docker/lock.py;",
        "# change setup.py or constraints.txt and run it again rather than editing this file.",
    ]
    path = ROOT / constraints
    path.write_text("\n".join(header + [f"{n}=={v}" for n, v in sorted(resolved.items())]) + "\n")
    return path


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python launch/docker/lock.py [--check]", file=sys.stderr)
        return 2
    here = (sys.version_info[:2], platform.system(), platform.machine())
    if here != (PYTHON, "Linux", "x86_64"):
        print(
            f"launch/docker/lock.py resolves for the images' Python {PYTHON[0]}.{PYTHON[1]} on "
            f"Linux x86_64; this is Python {here[0][0]}.{here[0][1]} on {here[1]} {here[2]}: "
            "run it in python:3.11 (docker run -v $PWD:/src -w /src python:3.11-slim-bookworm)",
            file=sys.stderr,
        )
        return 2
    if argv:
        problems = [p for image in IMAGES for p in unpinned(image)]
        print("\n".join(problems) or "every resolved package is pinned")
        return 1 if problems else 0
    for image in IMAGES:
        print(f"wrote {write(image).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
