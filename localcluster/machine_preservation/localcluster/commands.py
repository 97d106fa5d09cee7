"""`python -m machine_preservation.localcluster up|down`: a detached local control plane for kubectl."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from machine_preservation.localcluster.controlplane import ControlPlane, ControlPlaneError, stop_control_plane
from machine_preservation.localcluster.crds import install_crds
from machine_preservation.localcluster.mcm import DEFAULT_MCM_VERSION, mcm_versions
from machine_preservation.localcluster.toolchain import ToolchainError, ensure_control_plane_binaries


def up(args: argparse.Namespace) -> int:
    try:
        bin_dir = ensure_control_plane_binaries()
        plane = ControlPlane(directory=args.dir.resolve(), bin_dir=bin_dir, attached=False)
        plane.start(timeout=args.timeout)
    except (ToolchainError, ControlPlaneError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        install_crds(plane.kubeconfig, mcm_version=args.mcm_version)
    except Exception as error:  # the plane is running; do not leave it behind half set up
        stop_control_plane(plane.directory)
        print(f"error: installing CRDs failed: {error}", file=sys.stderr)
        return 1
    print(plane.kubeconfig)
    return 0


def down(args: argparse.Namespace) -> int:
    if not stop_control_plane(args.dir.resolve()):
        print(f"no control plane recorded in {args.dir}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m machine_preservation.localcluster",
        description="A real local control plane (etcd, kube-apiserver, kube-controller-manager) with MCM's CRDs.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("up", help="start the control plane and print the admin kubeconfig path")
    start.add_argument("--dir", type=Path, default=Path(".local/cluster"), help="state directory")
    start.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    start.add_argument(
        "--mcm-version",
        choices=mcm_versions(),
        default=DEFAULT_MCM_VERSION,
        help=f"install this MCM version's own CRDs, and Gardener's Cluster CRD (default {DEFAULT_MCM_VERSION})",
    )
    start.set_defaults(handler=up)
    stop = actions.add_parser("down", help="stop the control plane started in --dir and clean up")
    stop.add_argument("--dir", type=Path, default=Path(".local/cluster"), help="state directory")
    stop.set_defaults(handler=down)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.handler(args))
