"""The release artifacts: the sdist and the wheel ``python -m build`` makes from the tree
(``./dev release``), and what each must hold for a user to install and run it. Used by
``./dev release`` and tests/test_release.py."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = sorted(p.name for p in (ROOT / "schemas").glob("*.json"))


def build(outdir: Path) -> tuple[Path, Path]:
    """Build the sdist and the wheel into ``outdir`` (PyPA's build, isolated); their paths."""
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return sdist, wheel


def problems(sdist: Path, wheel: Path) -> list[str]:
    """What the artifacts lack or should not hold; empty when they are fit to publish."""
    found: list[str] = []
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
    if not (metadata.get_payload() or "").startswith("# triton-gitops"):
        found.append("wheel: the README is not its long description")
    with tarfile.open(sdist) as archive:
        top = {"/".join(n.split("/")[1:]) for n in archive.getnames()}
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"):
        if needed not in top:
            found.append(f"sdist: {needed} missing")
    return found


def main(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "dist")
    outdir.mkdir(parents=True, exist_ok=True)
    for old in [*outdir.glob("*.tar.gz"), *outdir.glob("*.whl")]:
        old.unlink()
    sdist, wheel = build(outdir)
    found = problems(sdist, wheel)
    for problem in found:
        print(f"release: {problem}", file=sys.stderr)
    if not found:
        print(f"release: {sdist.name} and {wheel.name} in {outdir}, checked")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
