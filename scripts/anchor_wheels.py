#!/usr/bin/env python3
"""The anchors' wheels for the H200, which has no network: download them where PyPI is reachable,
stage them in groups that fit one device call, install them there (plain Python 3, no torch).

    python3 scripts/anchor_wheels.py fetch [--extras]   # here: pip download, then pack into .whl/<group>/
    python3 scripts/anchor_wheels.py install            # on the H200: install every complete stack
    python3 scripts/anchor_wheels.py status             # what is staged, per group and per stack

(scripts/fetch_anchors.sh and scripts/install_anchors.sh call these.)

Packing. A device call carries at most 64 MiB: the working tree plus the `carry` paths. Each group
folder .whl/<group>/ holds at most GROUP_LIMIT bytes; a wheel larger than that is cut into PART-byte
pieces (`<wheel>.part-aa`, `-ab`, ...), re-joined on the device. Groups are named in staging order
(01-…, 02-…): carry one per call, in that order, while the machine stays warm. Every group holds a copy
of MANIFEST.tsv (stack, wheel, bytes, sha256, pieces), so the installer knows what is still missing.

Installing. Each stack (a set of wheels that belong together) goes into its own folder
/tmp/site/<stack> with `pip install --no-index --no-deps --target`, once all its wheels are present
and their sha256 match; pieces are first copied to /tmp/anchor_wheels, so they survive a refreshed
checkout while the machine is warm. /tmp/site/env.sh then sets PYTHONPATH to every installed stack
(with the paths their .pth files add: nvidia-cutlass-dsl needs that). Loose wheels directly under
.whl/ (the older layout) are installed as the stack "loose".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import site
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WHL = ROOT / ".whl"
MIB = 1024 * 1024
# A group leaves the working tree room under the 64 MiB a call carries (9.5 MiB in session 36, bench/results
# most of it).
GROUP_LIMIT = 50 * MIB
PART = 45 * MIB

# (group, stack, pin). Stacks: fla = FLA's Triton kernels (needs einops: in the H200 image);
# tvmffi = TVM-FFI, shared by TileLang and FlashInfer (one version satisfies both: tilelang 0.1.15 wants
# < 0.1.13, flashinfer 0.7.4 < 0.2); flashqla = FlashQLA + TileLang + z3 (TileLang's import loads libz3);
# flashinfer = FlashInfer + the CuTe DSL its SM90 GDN prefill is written in (only the cu13 flavour of
# the DSL's libraries: the H200's driver and torch are CUDA 13). Already in the H200 image (KINDS.md's
# package list), so not staged: torch, triton, numpy, einops, ml-dtypes, cloudpickle, psutil, tqdm,
# typing-extensions, packaging, requests, click, tabulate, ninja, nvidia-ml-py, protobuf, cuda-bindings,
# cuda-core, cuda-pathfinder, matplotlib.
PINS = [
    ("01-base", "fla", "fla-core==0.6.0"),
    ("01-base", "tvmffi", "apache-tvm-ffi==0.1.12"),
    ("01-base", "tvmffi", "torch-c-dlpack-ext==0.1.5"),
    ("01-base", "flashqla", "flash-qla==0.1.3"),
    ("01-base", "flashqla", "z3-solver==4.15.4.0"),
    ("02-tilelang", "flashqla", "tilelang==0.1.15"),
    ("03-flashinfer", "flashinfer", "flashinfer-python==0.7.4"),
    ("04-cutlass", "flashinfer", "nvidia-cutlass-dsl==4.8.1"),
    ("04-cutlass", "flashinfer", "nvidia-cutlass-dsl-libs-core==4.8.1"),
    ("04-cutlass", "flashinfer", "nvidia-cutlass-dsl-libs-base==4.8.1"),
    ("04-cutlass", "flashinfer", "nvidia-cutlass-dsl-libs-cu13==4.8.1"),
]
# flashinfer-python's other declared dependencies. `import flashinfer.gdn_prefill` was checked without
# them (CPU, Python 3.12, torch 2.11): the GDN prefill does not import them. Fetched with --extras only.
EXTRAS = [
    ("09-flashinfer-extras", "flashinfer-extras", "nvidia-cudnn-frontend==1.32.0"),
    ("09-flashinfer-extras", "flashinfer-extras", "nccl4py==0.6.0"),
    ("09-flashinfer-extras", "flashinfer-extras", "nccl-extensions==0.1.0"),
    ("09-flashinfer-extras", "flashinfer-extras", "cuda-tile==1.7.0"),
    ("09-flashinfer-extras", "flashinfer-extras", "cuda-python==13.4.4"),
]
# The H200 image: Python 3.12 (cp312), x86_64, glibc-based (manylinux); pip matches N of manylinux_2_N exactly.
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64", "any"]


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(pin: str, dest: pathlib.Path) -> pathlib.Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-q", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + [pin], check=True)
    name = pin.split("==")[0].replace("-", "_").lower()
    new = [p for p in set(dest.glob("*.whl")) - before] or [
        p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if len(new) != 1:
        raise SystemExit(f"fetch: expected one wheel for {pin}, found {[p.name for p in new]}")
    return new[0]


def split(path: pathlib.Path, part: int) -> list[tuple[str, bytes]]:
    data = path.read_bytes()
    pieces = []
    for i, start in enumerate(range(0, len(data), part)):
        suffix = chr(ord("a") + i // 26) + chr(ord("a") + i % 26)
        pieces.append((f"{path.name}.part-{suffix}", data[start:start + part]))
    return pieces


def pack(wheels: list[tuple[str, str, pathlib.Path]], dest: pathlib.Path, limit: int = GROUP_LIMIT,
         part: int = PART) -> dict[str, list[tuple[str, int]]]:
    """Lay (group, stack, wheel file) out in dest/<group>[-a|-b...]/ folders of at most `limit` bytes;
    returns {folder: [(file, bytes)]}. Writes MANIFEST.tsv into dest and into every folder."""
    for old in dest.glob("[0-9][0-9]-*"):
        shutil.rmtree(old)
    for loose in dest.glob("*.whl"):  # an older loose copy of a pinned wheel would install twice
        if any(loose.name == w.name for _, _, w in wheels):
            loose.unlink()
    order = list(dict.fromkeys(g for g, _, _ in wheels))
    folders: dict[str, list[tuple[str, int]]] = {}
    manifest = []
    for group in order:
        items = [(s, w) for g, s, w in wheels if g == group]
        total = sum(w.stat().st_size for _, w in items)
        pieces = []   # (stack, wheel, piece name, bytes or None for a whole wheel)
        for stack, w in items:
            if total > limit and w.stat().st_size > limit:
                pieces += [(stack, w, name, data) for name, data in split(w, part)]
            else:
                pieces.append((stack, w, w.name, None))
        names = [group] if total <= limit else [f"{group}-{chr(ord('a') + i)}" for i in range(26)]
        current, used, placed = 0, 0, {}
        for stack, w, name, data in pieces:
            size = len(data) if data is not None else w.stat().st_size
            if used and used + size > limit:
                current, used = current + 1, 0
            folder = dest / names[current]
            folder.mkdir(parents=True, exist_ok=True)
            if data is None:
                shutil.copy2(w, folder / name)
            else:
                (folder / name).write_bytes(data)
            used += size
            folders.setdefault(names[current], []).append((name, size))
            placed.setdefault(w, []).append(f"{names[current]}/{name}")
        for stack, w in items:
            manifest.append((stack, w.name, w.stat().st_size, sha256(w), ";".join(placed[w])))
    text = "stack\twheel\tbytes\tsha256\tpieces\n" + "".join("\t".join(map(str, m)) + "\n" for m in manifest)
    (dest / "MANIFEST.tsv").write_text(text)
    for folder in folders:
        (dest / folder / "MANIFEST.tsv").write_text(text)
    for folder, files in folders.items():
        size = sum(s for _, s in files)
        if size > limit:
            raise SystemExit(f"pack: {folder} holds {size} bytes, over the {limit}-byte limit")
    return folders


def read_manifest(dest: pathlib.Path) -> list[dict]:
    paths = sorted(dest.glob("*/MANIFEST.tsv")) + ([dest / "MANIFEST.tsv"] if (dest / "MANIFEST.tsv").is_file() else [])
    if not paths:
        return []
    lines = paths[0].read_text().splitlines()
    keys = lines[0].split("\t")
    return [dict(zip(keys, line.split("\t"))) for line in lines[1:] if line.strip()]


def collect(dest: pathlib.Path, store: pathlib.Path, manifest: list[dict]) -> dict[str, pathlib.Path]:
    """Copy every staged piece into store/pieces, join the complete wheels into store; returns
    {wheel name: path} of the wheels complete with a matching sha256."""
    pieces = store / "pieces"
    pieces.mkdir(parents=True, exist_ok=True)
    for f in dest.glob("[0-9][0-9]-*/*"):
        if f.name != "MANIFEST.tsv" and not (pieces / f.name).is_file():
            shutil.copy2(f, pieces / f.name)
    ready = {}
    for m in manifest:
        target = store / m["wheel"]
        names = [p.split("/", 1)[1] for p in m["pieces"].split(";")]
        if not (target.is_file() and target.stat().st_size == int(m["bytes"])):
            if not all((pieces / n).is_file() for n in names):
                continue
            with open(target, "wb") as out:
                for n in names:
                    out.write((pieces / n).read_bytes())
        if sha256(target) != m["sha256"]:
            print(f"anchor wheels: {m['wheel']}: sha256 mismatch, removed (re-stage its groups)")
            target.unlink()
            continue
        ready[m["wheel"]] = target
    return ready


def pip_install(wheels: list[pathlib.Path], target: pathlib.Path) -> bool:
    if target.exists():
        shutil.rmtree(target)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--disable-pip-version-check", "--target", str(target)] + [str(w) for w in wheels]
    return subprocess.run(cmd, env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore")).returncode == 0


def write_env(site_dir: pathlib.Path, stacks: list[str]) -> pathlib.Path:
    """site_dir/env.sh exporting PYTHONPATH for the installed stacks, .pth additions included."""
    before = list(sys.path)
    for stack in stacks:
        site.addsitedir(str(site_dir / stack))
    added = [p for p in sys.path if p not in before]
    env = site_dir / "env.sh"
    env.write_text("# written by scripts/anchor_wheels.py install: . this file to see the anchors\n"
                   f"export PYTHONPATH={':'.join(added)}${{PYTHONPATH:+:$PYTHONPATH}}\n" if added else
                   "# written by scripts/anchor_wheels.py install: no anchor installed\n")
    return env


def install(dest: pathlib.Path, site_dir: pathlib.Path, store: pathlib.Path) -> int:
    manifest = read_manifest(dest)
    site_dir.mkdir(parents=True, exist_ok=True)
    ready = collect(dest, store, manifest) if manifest else {}
    stacks = list(dict.fromkeys(m["stack"] for m in manifest))
    loose = sorted(dest.glob("*.whl"))
    lines, installed = [], []
    for stack in stacks:
        mine = [m for m in manifest if m["stack"] == stack]
        missing = [m for m in mine if m["wheel"] not in ready]
        if missing and stack.endswith("-extras"):
            lines.append(f"{stack}: not staged (optional)")
            continue
        if missing:
            groups = sorted({p.split("/")[0] for m in missing for p in m["pieces"].split(";")
                             if not (store / "pieces" / p.split("/", 1)[1]).is_file()})
            lines.append(f"{stack}: waiting for {len(missing)} of {len(mine)} wheels (groups {', '.join(groups)})")
            continue
        stamp = "\n".join(sorted(m["sha256"] for m in mine))
        marker = site_dir / stack / ".installed"
        if not (marker.is_file() and marker.read_text() == stamp):
            if not pip_install([ready[m["wheel"]] for m in mine], site_dir / stack):
                lines.append(f"{stack}: pip install failed")
                continue
            marker.write_text(stamp)
        installed.append(stack)
        lines.append(f"{stack}: installed ({len(mine)} wheels)")
    if loose:
        marker = site_dir / "loose" / ".installed"
        stamp = "\n".join(sorted(f"{w.name} {w.stat().st_size}" for w in loose))
        if (marker.is_file() and marker.read_text() == stamp) or pip_install(loose, site_dir / "loose"):
            marker.write_text(stamp)
            installed.append("loose")
            lines.append(f"loose: installed {', '.join(w.name for w in loose)}")
    env = write_env(site_dir, installed)
    print("anchor wheels: " + (" | ".join(lines) if lines else f"none staged under {dest}"))
    print(f"anchor wheels: . {env}")
    return 0


def status(dest: pathlib.Path) -> int:
    for folder in sorted(p for p in dest.glob("[0-9][0-9]-*") if p.is_dir()):
        files = [f for f in folder.iterdir() if f.name != "MANIFEST.tsv"]
        size = sum(f.stat().st_size for f in files)
        print(f"{folder.name:24s} {size / MIB:6.1f} MiB  " + ", ".join(sorted(f.name for f in files)))
    for m in read_manifest(dest):
        print(f"  {m['stack']:18s} {m['wheel']}  {int(m['bytes']) / MIB:.1f} MiB  in {m['pieces']}")
    return 0


def fetch(dest: pathlib.Path, extras: bool) -> int:
    pins = PINS + (EXTRAS if extras else [])
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="anchor-wheels-") as tmp:
        wheels = []
        for group, stack, pin in pins:
            w = download(pin, pathlib.Path(tmp))
            print(f"fetched {pin}: {w.name} ({w.stat().st_size / MIB:.1f} MiB)")
            wheels.append((group, stack, w))
        folders = pack(wheels, dest)
    print("groups (carry one per device call, in this order, while the machine is warm):")
    for folder, files in folders.items():
        print(f"  .whl/{folder:22s} {sum(s for _, s in files) / MIB:6.1f} MiB  {', '.join(n for n, _ in files)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the pinned wheels and pack them into .whl/<group>/")
    f.add_argument("--extras", action="store_true", help="also flashinfer-python's deps its GDN prefill does not import")
    f.add_argument("--dest", default=str(WHL))
    i = sub.add_parser("install", help="install every stack whose wheels are all staged (on the H200)")
    i.add_argument("--dest", default=str(WHL))
    i.add_argument("--site", default=os.environ.get("ANCHOR_SITE", "/tmp/site"))
    i.add_argument("--store", default=os.environ.get("ANCHOR_WHEELS", "/tmp/anchor_wheels"))
    s = sub.add_parser("status", help="list the staged groups and the manifest")
    s.add_argument("--dest", default=str(WHL))
    args = parser.parse_args(argv)
    if args.cmd == "fetch":
        return fetch(pathlib.Path(args.dest), args.extras)
    if args.cmd == "install":
        return install(pathlib.Path(args.dest), pathlib.Path(args.site), pathlib.Path(args.store))
    return status(pathlib.Path(args.dest))


if __name__ == "__main__":
    sys.exit(main())
