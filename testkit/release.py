"""The release: what pyproject.toml says it is (the version, the project's home, the image's
name), the sdist and the wheel ``python -m build`` makes from the tree, and every place outside
pyproject.toml that points at the release, checked against it.

pyproject.toml is the one setting: ``./dev image`` tags the image from it, the package reads its
version from its own metadata, and the copies users paste (the wheel's address in examples/ci and
the README, the image in the Kubernetes kustomization, the runbook links) must say what it says.
Used by ``./dev release``, ``./dev image`` and tests/test_release.py; stdlib only at import, so
that ``python3 -m testkit.release --image`` runs before any virtualenv exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = sorted(p.name for p in (ROOT / "schemas").glob("*.json"))

# Where users meet references to the release: these files, and every text file below these
# folders.
REFERRING = ("README.md", "CHANGELOG.md", "Dockerfile", "docs", "examples")
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".json", ".py", ".txt", ".toml", ""}
KUSTOMIZATION = Path("examples/deploy/kubernetes/kustomization.yaml")
DEPLOYMENT = Path("examples/deploy/kubernetes/deployment.yaml")

PLACEHOLDER = re.compile(r"YOUR-ORG|YOUR-TAG|example-org/triton-gitops")
HOME = re.compile(r"https://github\.com/[\w.-]+/triton-gitops(?![\w.-])")
WHEEL_URL = re.compile(r"https://[^\s\"'<>)]+/triton_gitops-[^\s\"'<>)/]+\.whl")
# An image named triton-gitops on a registry: the usual ones, and the release's own (the
# registry part of its name, whatever it is: _image_ref adds it).
IMAGE_REF = (
    r"(?<![\w./-])((?:ghcr\.io|docker\.io|quay\.io|localhost|{registry})/(?:[\w.-]+/)*"
    r"triton-gitops)(?![\w-])(?::([\w.-]+))?"
)


def _image_ref(release: Release) -> re.Pattern[str]:
    return re.compile(IMAGE_REF.format(registry=re.escape(release.image.split("/")[0])))


@dataclass(frozen=True)
class Release:
    """The coordinates of a release, as pyproject.toml gives them."""

    version: str
    source: str  # [project.urls] Source: the repository, where the release is published
    image: str  # [tool.triton-gitops] image: the container image's name, without a tag

    @property
    def tag(self) -> str:
        return f"v{self.version}"

    @property
    def wheel(self) -> str:
        return f"triton_gitops-{self.version}-py3-none-any.whl"

    @property
    def sdist(self) -> str:
        return f"triton_gitops-{self.version}.tar.gz"

    @property
    def wheel_url(self) -> str:
        """Where the release's wheel is downloaded from: an asset of the tag's release."""
        return f"{self.source}/releases/download/{self.tag}/{self.wheel}"

    @property
    def image_ref(self) -> str:
        return f"{self.image}:{self.version}"


def current(root: Path = ROOT) -> Release:
    """The release pyproject.toml describes."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return Release(
        version=pyproject["project"]["version"],
        source=pyproject["project"]["urls"]["Source"],
        image=pyproject["tool"]["triton-gitops"]["image"],
    )


def _referring_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for name in REFERRING:
        path = root / name
        if path.is_dir():
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
            ]
        else:
            files.append(path)
    return files


def stale_references(release: Release, root: Path = ROOT) -> list[str]:
    """Every reference to the release that pyproject.toml does not give, and every placeholder
    for one: ``FILE:LINE: what is written; what pyproject.toml says``. Empty when all agree."""
    found: list[str] = []
    image_ref = _image_ref(release)
    for path in _referring_files(root):
        where = path.relative_to(root)
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            at = f"{where}:{number}"
            for match in PLACEHOLDER.finditer(line):
                found.append(f"{at}: placeholder {match.group()!r}; pyproject.toml has the release")
            for match in HOME.finditer(line):
                if match.group() != release.source:
                    found.append(f"{at}: {match.group()}; the project's home is {release.source}")
            for match in WHEEL_URL.finditer(line):
                if match.group() != release.wheel_url:
                    found.append(
                        f"{at}: {match.group()}; the release's wheel is {release.wheel_url}"
                    )
            for match in image_ref.finditer(line):
                name, tag = match.groups()
                if name != release.image or tag not in (None, release.version):
                    found.append(
                        f"{at}: image {match.group()}; the release's is {release.image_ref}"
                    )
    found += _kustomization_problems(release, root)
    changelog = (root / "CHANGELOG.md").read_text()
    if not re.search(
        rf"^## \[{re.escape(release.version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M
    ):
        found.append(f"CHANGELOG.md: no dated section '## [{release.version}] - YYYY-MM-DD'")
    return found


def _kustomization_problems(release: Release, root: Path) -> list[str]:
    """The Kubernetes example runs the release's image: kustomize's ``images:`` sets it on the
    Deployment's container, whose own ``image`` is only the name kustomize replaces."""
    from ruamel.yaml import YAML  # not at import: `--image` runs with no virtualenv

    yaml = YAML(typ="safe")
    kustomization = yaml.load((root / KUSTOMIZATION).read_text())
    deployment = yaml.load((root / DEPLOYMENT).read_text())
    (container,) = [
        c
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "triton-gitops"
    ]
    entries = [i for i in kustomization.get("images", []) if i.get("name") == container["image"]]
    if len(entries) != 1:
        return [f"{KUSTOMIZATION}: no images entry for the Deployment's {container['image']!r}"]
    (entry,) = entries
    if (entry.get("newName"), str(entry.get("newTag"))) != (release.image, release.version):
        return [
            f"{KUSTOMIZATION}: images sets {entry.get('newName')}:{entry.get('newTag')}; "
            f"the release's is {release.image_ref}"
        ]
    return []


def notes(release: Release, root: Path = ROOT) -> str:
    """The release's notes: its section of CHANGELOG.md, without the heading."""
    changelog = (root / "CHANGELOG.md").read_text()
    start = re.search(rf"^## \[{re.escape(release.version)}\].*\n", changelog, re.M)
    if start is None:
        return ""
    end = re.search(r"^## \[", changelog[start.end() :], re.M)
    section = changelog[start.end() : start.end() + end.start() if end else None]
    return section.strip() + "\n"


def build(outdir: Path) -> tuple[Path, Path]:
    """Build the sdist and the wheel into ``outdir`` (PyPA's build, isolated); their paths."""
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return sdist, wheel


def twine_check(*artifacts: Path) -> list[str]:
    """twine's check (strict: warnings count): what an index would refuse or show broken."""
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode == 0:
        return []
    return [f"twine check: {line}" for line in (done.stdout + done.stderr).splitlines() if line]


def problems(sdist: Path, wheel: Path, release: Release | None = None) -> list[str]:
    """What the artifacts lack or should not hold; empty when they are fit to publish."""
    release = release or current()
    found: list[str] = []
    if (sdist.name, wheel.name) != (release.sdist, release.wheel):
        found.append(f"named {sdist.name} and {wheel.name}; version {release.version} in pyproject")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    for schema in SCHEMAS:
        if f"reconciler/schemas/{schema}" not in names:
            found.append(f"wheel: schemas/{schema} missing (the validator reads it)")
    if f"{info}/licenses/LICENSE" not in names:
        found.append("wheel: no LICENSE in its dist-info")
    stray = sorted({n.split("/")[0] for n in names} - {"reconciler", info})
    if stray:
        found.append(f"wheel: holds {stray}: only the package and its metadata belong")
    if "triton-gitops = reconciler.cli:main" not in entry_points:
        found.append("wheel: no triton-gitops command")
    if metadata.get("License-Expression") != "Apache-2.0":
        found.append(f"wheel: License-Expression {metadata.get('License-Expression')!r}")
    if f"Source, {release.source}" not in (metadata.get_all("Project-URL") or []):
        found.append(f"wheel: no Project-URL 'Source, {release.source}'")
    if not (metadata.get_payload() or "").startswith("# triton-gitops"):
        found.append("wheel: the README is not its long description")
    with tarfile.open(sdist) as archive:
        top = {"/".join(n.split("/")[1:]) for n in archive.getnames()}
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"):
        if needed not in top:
            found.append(f"sdist: {needed} missing")
    return found


def main(argv: list[str]) -> int:
    release = current()
    printed = {
        "--image": release.image_ref,
        "--version": release.version,
        "--source": release.source,
    }
    if argv and argv[0] in printed:
        print(printed[argv[0]])
        return 0
    outdir = Path(argv[0] if argv else "dist")
    outdir.mkdir(parents=True, exist_ok=True)
    for old in [*outdir.glob("*.tar.gz"), *outdir.glob("*.whl")]:
        old.unlink()
    sdist, wheel = build(outdir)
    found = problems(sdist, wheel, release) + twine_check(sdist, wheel) + stale_references(release)
    for problem in found:
        print(f"release: {problem}", file=sys.stderr)
    if found:
        return 1
    notes_file = outdir / "notes.md"
    notes_file.write_text(notes(release))
    print(f"release: {sdist.name} and {wheel.name} in {outdir}, checked; the notes in {notes_file}")
    print("release: to publish (docs/releasing.md):")
    print(f"  git tag -s {release.tag} -m 'triton-gitops {release.version}'")
    print(f"  git push origin {release.tag}")
    print(f"  gh release create {release.tag} {sdist} {wheel} --notes-file {notes_file}")
    print(f"  ./dev image && podman push {release.image_ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
