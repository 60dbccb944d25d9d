"""`hack/cluster up|down|restart|status|build|tools|autoscaling`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localcluster.cluster import LocalCluster
from localcluster.errors import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/cluster", description="Local control plane with a fake AMD fleet")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build (cached) and start the control plane, load the fleet")
    up.add_argument("--fleet", type=Path, help="fleet YAML (default hack/fleets/demo.yaml)")
    sub.add_parser("down", help="stop every process by PID and remove the data dir")
    restart = sub.add_parser("restart", help="restart one component with the same flags, keeping its data")
    restart.add_argument("component", help="apiserver, etcd, controller-manager, scheduler or kwok")
    restart.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM (a crash)")
    restart.add_argument("--down-seconds", type=float, default=0.0, help="stay down this long before starting")
    sub.add_parser("status", help="show what is running")
    sub.add_parser("build", help="only build (or find cached) binaries and print their paths")
    tools = sub.add_parser("tools", help="build (or find cached) the test tools (promtool) and print their paths")
    tools.add_argument("--gateway", action="store_true",
                       help="also Traefik, a Gateway API implementation (docs/local-traffic.md)")
    tools.add_argument("--autoscaling", action="store_true",
                       help="also the Prometheus server and KEDA (operator, metrics server): docs/autoscaling.md")
    sub.add_parser("autoscaling", help="start Prometheus and KEDA (operator, metrics server) next to the running "
                   "cluster, serving external.metrics.k8s.io through the aggregator (docs/autoscaling.md)")
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    try:
        if args.command == "up":
            cluster.up(args.fleet)
        elif args.command == "down":
            cluster.down()
        elif args.command == "restart":
            cluster.restart(args.component, kill=args.kill, down_seconds=args.down_seconds)
        elif args.command == "build":
            from localcluster.build import ensure_binaries

            for name, path in ensure_binaries(cluster.log).items():
                print(f"{name}\t{path}")
        elif args.command == "tools":
            from localcluster.build import ensure_tools

            for name, path in ensure_tools(cluster.log, gateway=args.gateway, autoscaling=args.autoscaling).items():
                print(f"{name}\t{path}")
        elif args.command == "autoscaling":
            from localcluster.autoscaling import AutoscalingPipeline

            AutoscalingPipeline(cluster).up()
        else:
            print(json.dumps(cluster.status(), indent=2))
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
