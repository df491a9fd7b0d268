"""Vendor pinned files from npm packages into ``build/vendor/npm/<package>/<file>``.

``tools/npm-assets.json`` records, for each package, an exact version and the SHA-256 of every
file taken from it::

    {"hls.js": {"version": "1.6.15", "files": {"dist/hls.min.js": "<sha256>"}}}

For each package whose files are not all present with the recorded digest, ``npm pack
<name>@<version>`` fetches the tarball from the npm registry (nothing else is contacted), each
listed file is checked against its digest and written atomically (a temp file in the same
directory, fsync, rename). Files already there and matching are left alone, so a second run
does nothing and needs no network. A digest mismatch (a re-published tarball, a wrong record)
exits with status 1 and says which file; nothing unchecked is written.

Usage: ``python -m tools.vendor_npm [--manifest tools/npm-assets.json] [--out build/vendor/npm]``
(``make vendor``; ``make test`` and ``make run`` depend on it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tools" / "npm-assets.json"
OUT = ROOT / "build" / "vendor" / "npm"
NPM_TIMEOUT_S = 300


class VendorError(Exception):
    """A package could not be vendored (the text says why)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _matches(path: Path, digest: str) -> bool:
    try:
        return sha256(path.read_bytes()) == digest
    except OSError:
        return False


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _pack(name: str, version: str, workdir: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError("npm is not installed (apt-get install npm)")
    done = subprocess.run(
        [npm, "pack", f"{name}@{version}", "--pack-destination", str(workdir), "--json", "--silent"],
        capture_output=True,
        timeout=NPM_TIMEOUT_S,
        cwd=workdir,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise VendorError(f"npm pack {name}@{version} failed: {' / '.join(tail)}")
    tarballs = sorted(workdir.glob("*.tgz"))
    if len(tarballs) != 1:
        raise VendorError(f"npm pack {name}@{version} left {len(tarballs)} tarballs")
    return tarballs[0]


def vendor_package(name: str, spec: dict[str, Any], out: Path) -> list[str]:
    """Vendor one package; answers the files written (empty when all were already there)."""
    version = spec["version"]
    files: dict[str, str] = spec["files"]
    target = out / name
    missing = {rel: digest for rel, digest in files.items() if not _matches(target / rel, digest)}
    if not missing:
        return []
    with tempfile.TemporaryDirectory(prefix="vendor-npm-") as tmp:
        tarball = _pack(name, version, Path(tmp))
        checked: dict[str, bytes] = {}
        with tarfile.open(tarball, "r:gz") as archive:
            for rel, digest in missing.items():
                try:
                    member = archive.extractfile(f"package/{rel}")
                except KeyError:
                    member = None
                if member is None:
                    raise VendorError(f"{name}@{version} has no file {rel}")
                data = member.read()
                got = sha256(data)
                if got != digest:
                    raise VendorError(
                        f"{name}@{version} {rel}: SHA-256 {got} does not match the recorded {digest} "
                        "(tools/npm-assets.json); nothing was written"
                    )
                checked[rel] = data
    for rel, data in checked.items():
        _write_atomic(target / rel, data)
    return sorted(checked)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    manifest: dict[str, dict[str, Any]] = json.loads(args.manifest.read_text())
    try:
        for name, spec in manifest.items():
            for rel in vendor_package(name, spec, args.out):
                print(f"vendored {name}@{spec['version']} {rel}")
    except (VendorError, subprocess.TimeoutExpired) as exc:
        print(f"vendor_npm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
