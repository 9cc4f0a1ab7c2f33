"""`gpuop package build`: a format 2 driver package (`gpuop.host.manifests`) from Debian's
NVIDIA packages or NVIDIA's `.run` installer, added to a driver source's index.

    gpuop package build --from-debian --version 535.261.03 --kernel 6.1.0-57-amd64 \\
        --flavour open --out /srv/drivers [--sign-key KEY] [--work DIR] [--debs DIR]
        [--arch arm64]                            cross-compiled (the kernel names it too)
        [--host-glibc 2.36]                       the hosts' glibc the user space must fit
        [--module-key PEM --module-cert CERT]     modules signed, for lockdown and Secure Boot
    gpuop package build --from-run NVIDIA-Linux-x86_64-535.261.03.run --extract-only --out DIR
    gpuop package build --from-run FILE --kernel K --flavour F --out /srv/drivers
    gpuop package keygen [--secret-key ~/.minisign/gpuop.key] [--public-key FILE]
    gpuop package plan --source DIR|URL [--kubeconfig F] [--nats URLS] [--pool P] [--json]
    gpuop package build --missing --source DIR [--kubeconfig F] [--nats URLS] [--sign-key KEY]

`plan` reads the fleet as `gpuop upgrade plan` does and prints the packages it needs and the
source lacks, with the build command of each (`gpuop.cli.matrix`); `build --missing` builds
exactly those into the source directory.

The build itself is `gpuop.host.building`'s; this module reads the flags, says what it
built (archive, sha256, index) and maps a failed step to exit 1 with its words.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from gpuop.cli import matrix, upgrade
from gpuop.cli.errors import CommandFailed
from gpuop.cli.verbs import add_command
from gpuop.host import branches, building, manifests, packaging
from gpuop.host.manifests import Flavour


def add_parser(verbs: Any) -> None:
    actions = add_command(
        verbs,
        "package",
        help="build driver packages for a driver source",
        description="Build format 2 driver packages (kernel modules, user space, firmware).",
    )
    build = actions.add_parser(
        "build",
        help="build a package from Debian's NVIDIA packages or NVIDIA's .run",
        description="Build a driver package and add it to the driver source --out; with "
        "--missing, every package the fleet needs and the driver source --source lacks.",
        parents=[upgrade.kube_flags(with_json=False), upgrade.nats_flags()],
    )
    origin = build.add_mutually_exclusive_group(required=True)
    origin.add_argument(
        "--from-debian",
        action="store_true",
        help="fetch Debian's NVIDIA packages of the version's branch (535: bookworm, 550: "
        "trixie; non-free, contrib, non-free-firmware)",
    )
    origin.add_argument("--from-run", type=Path, metavar="FILE", help="NVIDIA's .run installer")
    origin.add_argument(
        "--missing",
        action="store_true",
        help="from Debian, every package `gpuop package plan --source` lists as missing",
    )
    build.add_argument("--source", help="--missing: the driver source directory to fill")
    build.add_argument("--extract-only", action="store_true", help="--from-run: only unpack")
    build.add_argument("--version", help="driver version, 535.261.03 (--from-debian)")
    build.add_argument("--kernel", help="kernel release to build the modules for")
    build.add_argument("--flavour", choices=[f.value for f in Flavour], help="module tree")
    build.add_argument(
        "--arch",
        choices=sorted(branches.ARCHES),
        help="architecture to build for (default: the one the kernel release names, else "
        "amd64); arm64 with Debian's cross compiler",
    )
    build.add_argument(
        "--host-glibc",
        default=branches.HOST_GLIBC,
        help=f"the hosts' glibc: a branch whose user space needs more is refused "
        f"(default {branches.HOST_GLIBC}, Debian bookworm's)",
    )
    build.add_argument("--out", type=Path, help="driver source directory")
    build.add_argument(
        "--sign-key",
        type=Path,
        help="minisign secret key (an encrypted one's password from $GPUOP_SIGN_KEY_PASSWORD "
        "or the terminal)",
    )
    build.add_argument("--module-key", type=Path, help="sign the modules: private key, PEM")
    build.add_argument("--module-cert", type=Path, help="the module key's X.509 certificate")
    build.add_argument("--work", type=Path, help="work directory, kept (default: temporary)")
    build.add_argument("--debs", type=Path, help="keep fetched .debs here between builds")
    build.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="make -j")
    build.set_defaults(handler=build_package)
    keygen = actions.add_parser(
        "keygen",
        help="make a minisign key pair to sign driver sources with",
        description="Make an unencrypted minisign key pair (the secret key file mode 0600); "
        "its public key goes into the policy's publicKeys.",
    )
    keygen.add_argument(
        "--secret-key",
        type=Path,
        default=Path("~/.minisign/gpuop.key"),
        help="secret key file to write (default ~/.minisign/gpuop.key); never replaced",
    )
    keygen.add_argument(
        "--public-key", type=Path, help="public key file to write (default: beside it, .pub)"
    )
    keygen.set_defaults(handler=make_key_pair)
    plan = actions.add_parser(
        "plan",
        help="the packages the fleet needs and a driver source lacks",
        description="List the driver packages (version, flavour, kernel, architecture) the "
        "fleet's nodes need for the policy's versions and the driver source --source lacks, "
        "and the gpuop package build command of each. Reads Kubernetes, the event log "
        "(nodes' inventories: what kernelModuleType auto resolves from) when --nats is given.",
        parents=[upgrade.kube_flags(), upgrade.nats_flags()],
    )
    plan.add_argument("--source", required=True, help="driver source: a directory or URL")
    plan.set_defaults(handler=plan_packages)


async def fleet_plan(args: argparse.Namespace, environ: Mapping[str, str]) -> matrix.Plan:
    """What the fleet needs from `--source` and it lacks."""
    given = str(args.source)
    if given.startswith("file://"):
        given = unquote(urlsplit(given).path)
    local = Path(given)
    source = given if "://" in given else str(await asyncio.to_thread(local.absolute))
    return await matrix.plan(await upgrade.read(args, environ), source)


async def plan_packages(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    found = await fleet_plan(args, environ)
    text = json.dumps(found.document()) if args.json else "\n".join(found.lines())
    print(text, flush=True)
    return 0


async def make_key_pair(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    secret = args.secret_key.expanduser()
    public = (args.public_key or secret.with_suffix(".pub")).expanduser()
    if secret.exists():
        raise ValueError(f"--secret-key {secret} exists; refusing to replace a key")
    key = packaging.write_key_pair(secret, public)
    print(
        f"secret key {secret} (mode 0600, unencrypted: keep it as secret as a password)\n"
        f"public key {public}\n"
        f"  {key.public_key.to_base64()}   (the policy's driver.gpu.publicKeys entry)"
    )
    return 0


async def build_package(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if not args.missing:
        if args.out is None:
            raise ValueError("building a package needs --out")
        if args.source is not None:
            raise ValueError("--source goes with --missing (one package goes to --out)")
        return await asyncio.to_thread(_build, args)
    given = [f for f, v in (("--version", args.version), ("--kernel", args.kernel)) if v]
    given += ["--flavour"] if args.flavour else []
    given += ["--arch"] if args.arch else []
    given += ["--out"] if args.out is not None else []
    if given:
        raise ValueError(f"--missing builds what the plan lists: drop {', '.join(given)}")
    if not args.source or "://" in args.source.removeprefix("file://"):
        raise ValueError("--missing builds into a driver source directory: pass --source DIR")
    found = await fleet_plan(args, environ)
    unbuildable = [p for p in found.packages if p.build_command() is None]
    if unbuildable:
        raise CommandFailed(
            "cannot build every missing package, so none was built:\n  "
            + "\n  ".join(f"{p.describe()}: {p.why_not_buildable()}" for p in unbuildable)
        )
    print("\n".join(found.lines()), flush=True)
    for package in found.packages:
        one = argparse.Namespace(
            **{
                **vars(args),
                "from_debian": True,
                "version": package.version,
                "kernel": package.kernel,
                "flavour": package.flavour,
                "arch": package.arch,
                "out": Path(package.source.removeprefix("file://")),
                "work": args.work / package.kernel / f"{package.version}-{package.flavour}"
                if args.work is not None
                else None,
            }
        )
        await asyncio.to_thread(_build, one)
    print(f"built {len(found.packages)} package(s) into {found.source}", flush=True)
    return 0


def _build(args: argparse.Namespace) -> int:
    if args.from_run is not None and args.extract_only:
        return _extract(args.from_run, args.out)
    if args.extract_only:
        raise ValueError("--extract-only goes with --from-run")
    missing = [
        flag
        for flag, value in (
            ("--kernel", args.kernel),
            ("--flavour", args.flavour),
            ("--version", args.version if args.from_debian else "-"),
        )
        if not value
    ]
    if missing:
        raise ValueError(f"building a package needs {', '.join(missing)}")
    if args.sign_key is not None and not args.sign_key.is_file():
        raise ValueError(f"--sign-key {args.sign_key}: no such file")
    if (args.module_key is None) != (args.module_cert is None):
        raise ValueError("--module-key and --module-cert go together")
    module_signing = (
        building.ModuleSigning(args.module_key, args.module_cert)
        if args.module_key is not None
        else None
    )
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: at least 1")
    with tempfile.TemporaryDirectory(prefix="gpuop-package-") as scratch:
        work = args.work or Path(scratch)
        try:
            build = (
                functools.partial(
                    building.build_from_debian, version=args.version, host_glibc=args.host_glibc
                )
                if args.from_debian
                else functools.partial(building.build_from_run, args.from_run)
            )
            built = build(
                kernel_release=args.kernel,
                flavour=Flavour(args.flavour),
                out=args.out,
                work=work,
                debs=args.debs,
                jobs=args.jobs,
                signing_key=args.sign_key,
                module_signing=module_signing,
                arch=args.arch,
            )
        except (building.BuildError, manifests.ManifestError) as exc:
            raise CommandFailed(str(exc)) from None
    index = args.out / packaging.INDEX
    signed = "signed" if args.sign_key is not None else "UNSIGNED (no --sign-key)"
    print(f"{built.path}\n  sha256 {built.sha256}\n  added to {index}, {signed}")
    return 0


def _extract(run: Path, out: Path) -> int:
    if not run.is_file():
        raise ValueError(f"--from-run {run}: no such file")
    try:
        header = building.extract_run(run, out)
    except building.BuildError as exc:
        raise CommandFailed(str(exc)) from None
    print(f"{run.name}: {header.label or 'makeself archive'} unpacked into {out}")
    return 0
