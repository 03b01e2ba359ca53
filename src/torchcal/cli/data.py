"""``torchcal data``: list the supported data sets and their official files, check a data
root, and download + verify + extract data sets ahead of training (e.g. on a login node).

Examples::

    torchcal data list
    torchcal data check --data-root ~/data
    torchcal data download cifar10 svhn cifar10c --data-root ~/data
"""

from __future__ import annotations

import argparse

from ..data import default_root, list_datasets, list_ood_sets
from ..data.download import RESOURCES
from ..data.prepare import PREPARABLE, prepare, status

__all__ = ["register"]


def _cmd_list(args: argparse.Namespace) -> int:
    print("data sets (load_splits):", ", ".join(list_datasets()))
    print("OOD sets (load_ood):     ", ", ".join(list_ood_sets()))
    print("official files (published MD5):")
    for r in RESOURCES.values():
        print(f"  {r.filename:26s} {r.md5}  {r.url}")
    print("digits: bundled with scikit-learn; imagenet: class folders train/<wnid>/, val/<wnid>/ "
          "(manual download from https://image-net.org)")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    root = default_root(args.data_root)
    names = args.names or list(PREPARABLE)
    all_ready = True
    for name in names:
        st = status(name, root)
        all_ready &= st["ready"]
        if st["ready"]:
            print(f"{name:13s} ready")
        else:
            have = [f for f, ok in st["archives"].items() if ok]
            hint = (f"archive present ({', '.join(have)}), not extracted" if have
                    else "absent: torchcal data download " + name)
            print(f"{name:13s} missing {st['missing'][0]} ({hint})")
    print(f"data root: {root.resolve()}")
    return 0 if all_ready else 1


def _cmd_download(args: argparse.Namespace) -> int:
    root = default_root(args.data_root)
    for name in args.names:
        prepare(name, root, download=True, verify=not args.no_verify, progress=not args.no_progress)
        print(f"{name}: ready in {root.resolve()}")
    return 0


def register(subparsers) -> None:
    """Add ``torchcal data list | check | download``."""
    p = subparsers.add_parser(
        "data", help="list, check and download the data sets",
        description="List the supported data sets and their official files, check what a data "
                    "root holds, or download (MD5-verified) and safely extract data sets.")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True

    lp = sub.add_parser("list", help="data sets, OOD sets, official files, URLs and MD5s")
    lp.set_defaults(func=_cmd_list)

    cp = sub.add_parser("check", help="what is present in the data root (exit 1 if anything is missing)")
    cp.add_argument("names", nargs="*", metavar="NAME", help=f"data sets to check (default all: {', '.join(PREPARABLE)})")
    cp.add_argument("--data-root", default=None,
                    help="data directory (default $TORCHCAL_DATA_ROOT, else ./data)")
    cp.add_argument("--debug", action="store_true", help="show tracebacks")
    cp.set_defaults(func=_cmd_check)

    dp = sub.add_parser("download", help="download, verify and extract data sets")
    dp.add_argument("names", nargs="+", choices=list(PREPARABLE), metavar="NAME",
                    help=f"data sets: {', '.join(PREPARABLE)}")
    dp.add_argument("--data-root", default=None,
                    help="data directory (default $TORCHCAL_DATA_ROOT, else ./data)")
    dp.add_argument("--no-verify", action="store_true",
                    help="do not check the MD5 of archives already present")
    dp.add_argument("--no-progress", action="store_true", help="no progress bar")
    dp.add_argument("--debug", action="store_true", help="show tracebacks")
    dp.set_defaults(func=_cmd_download)
