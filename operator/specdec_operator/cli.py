"""`specdec-operator` command line: run the operator, generate CRDs, benchmarks and the fleet view."""

from __future__ import annotations

import argparse
import gc
import random
import sys
from collections.abc import Sequence
from typing import Any

from specdec_operator import KIND
from specdec_operator.version import version_line


def _crds(args: argparse.Namespace) -> int:
    from specdec_operator.crdfiles import check_crd_files, write_crd_files

    if args.check:
        stale = check_crd_files()
        for path in stale:
            sys.stderr.write(f"error: {path} is out of date; run `specdec-operator crds generate`\n")
        return 1 if stale else 0
    for path in write_crd_files():
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio

    import kopf

    import specdec_operator.handlers.register  # noqa: F401  (registers the handlers)
    from specdec_operator.handlers.services.namespace_discovery import notice_namespaces_listed_at_watch_start
    from specdec_operator.handlers.services.shutdown import run_operator
    from specdec_operator.settings import OperatorEnvSettings

    settings = OperatorEnvSettings()
    problem = settings.scope_problem()
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        return 2
    namespaces = settings.namespaces
    log_format = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[
        settings.log_format]
    kopf.configure(verbose=args.verbose, log_format=log_format)
    notice_namespaces_listed_at_watch_start()
    # kopf.run(), with SIGTERM and SIGINT handled by the operator so a stop is prompt (handlers/services/shutdown.py).
    asyncio.run(run_operator(
        settings.shutdown_grace_seconds,
        kopf.OperatorSettings(),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=settings.standalone,
        peering_name=None if settings.standalone else settings.peering_name,
        # Equal priorities make every kopf replica pause; a random one lets exactly one act.
        priority=random.randint(1, 10_000),
        liveness_endpoint=args.liveness,
    ))
    # Everything has stopped; what is left is the interpreter's teardown, whose garbage collections walk
    # the whole heap (kopf, kubernetes_asyncio's models, the watch caches): measured 2.6-3.3 s of a loaded
    # 2-core machine's time after SIGTERM. Nothing needs collecting on the way out, so skip them.
    gc.freeze()
    return 0


def _recording_text(name: str) -> str:
    """A recording's text: from a file, gzip-compressed or not (recordings run to megabytes), or `-` for stdin."""
    import gzip
    from pathlib import Path

    raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise OSError(f"{name}: not a readable gzip file: {err}") from err
    return raw.decode("utf-8")


def _spec_document(name: str, documents: list[Any]) -> dict[str, Any] | None:
    """The replay's settings from a --spec file's YAML documents: its one SpeculativeModel (a file may hold the
    HTTPRoute beside it, as examples/canary-httproute.yaml does), else its one document."""
    from specdec_operator.canary.replay import RecordingError

    documents = [document for document in documents if document is not None]  # `---` at the end reads as None
    models = [document for document in documents if isinstance(document, dict) and document.get("kind") == KIND]
    if len(models) > 1:
        raise RecordingError(f"{name}: holds {len(models)} SpeculativeModels; give a file with the one recorded")
    chosen = models or documents
    if len(chosen) > 1:
        raise RecordingError(f"{name}: holds {len(chosen)} YAML documents and no SpeculativeModel; give one mapping")
    if chosen and not isinstance(chosen[0], dict):
        raise RecordingError(f"{name}: must be a YAML mapping")
    return chosen[0] if chosen else None


def _canary_replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from specdec_operator.canary.replay import RecordingError, format_result, load_spec, parse_recording, replay

    try:
        header, records = parse_recording(_recording_text(args.file))
        if args.spec:
            header = _spec_document(args.spec, list(yaml.safe_load_all(Path(args.spec).read_text())))
        spec = load_spec(header)
    except (OSError, UnicodeDecodeError, RecordingError, yaml.YAMLError) as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    if not records:
        sys.stderr.write(f"error: {args.file} holds no records\n")
        return 2
    result = replay(records, spec)
    sys.stdout.write(format_result(result, spec))
    return 0


def _canary_from_prometheus(args: argparse.Namespace) -> int:
    import json
    import re

    from specdec_operator.canary.from_prometheus import PodRoles, PrometheusExportError, recording_lines

    try:
        if args.pool:
            roles = PodRoles.of_pool(args.pool)
        elif args.canary and args.stable:
            roles = PodRoles(canary=re.compile(args.canary), stable=re.compile(args.stable),
                             baseline=re.compile(args.baseline) if args.baseline else None)
        else:
            raise PrometheusExportError("give --pool (the pool's stable Deployment, <model>-<gfx>), or --canary "
                                        "and --stable patterns of pod names")
        answers = [(name, json.loads(_recording_text(name))) for name in args.files]
        lines, notes = recording_lines(answers, roles, args.pod_label)
    except (OSError, UnicodeDecodeError, ValueError, re.error) as err:  # json and the export errors are ValueErrors
        sys.stderr.write(f"error: {err}\n")
        return 2
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    if not lines:
        return 1
    sys.stdout.write("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)

    crds = sub.add_parser("crds", help="generate the CRD YAML from the pydantic models")
    crds.add_argument("action", choices=["generate"])
    crds.add_argument("--check", action="store_true", help="fail if the committed files differ")
    crds.set_defaults(func=_crds)

    run = sub.add_parser("run", help="run the operator (settings from SPECDEC_* environment variables)")
    run.add_argument("--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.set_defaults(func=_run)
    canary = sub.add_parser("canary", help="canary tools: `canary replay FILE [--spec FILE]`, `canary from-prometheus "
                            "ANSWER... --pool NAME`")
    canary_sub = canary.add_subparsers(dest="canary_command", required=True)
    replay = canary_sub.add_parser(
        "replay", help="replay a recorded canary (JSON lines of /metrics scrapes, docs/canary.md) through the "
        "operator's analysis and step machine; print each step's verdict and the outcome")
    replay.add_argument("file", help="the recording: an optional YAML header, then one JSON object per line "
                        "(gzip-compressed or not; - reads stdin)")
    replay.add_argument("--spec", default=None,
                        help="YAML with the steps and analysis (spec.rollout.canary's fields), or the whole "
                        "SpeculativeModel (`kubectl get -o yaml`: its pool, replicas and K change too); overrides "
                        "the header")
    replay.set_defaults(func=_canary_replay)
    export = canary_sub.add_parser(
        "from-prometheus", help="write a recording for `canary replay` from Prometheus HTTP API answers (JSON, "
        "resultType matrix) holding the pods' vLLM series: the raw samples of a range selector, e.g. "
        "query={__name__=~\"vllm:.+\",pod=~\"llama8b-gfx942-.*\"}[2h] (docs/canary.md)")
    export.add_argument("files", nargs="+", help="the answers (gzip-compressed or not; - reads stdin); answers "
                        "with kube-state-metrics' kube_pod_status_ready, kube_pod_status_phase and "
                        "kube_pod_container_status_restarts_total, and Prometheus' up, give pod state")
    export.add_argument("--pool", default=None, help="the pool's stable Deployment (<model>-<gfx>): its pods are the "
                        "stable's, those of <pool>-canary the canary's")
    export.add_argument("--canary", default=None, help="or: a pattern the canary pods' names match whole")
    export.add_argument("--stable", default=None, help="and one the stable pods' names match whole")
    export.add_argument("--baseline", default=None, help="optional: one a baseline's pods match whole")
    export.add_argument("--pod-label", default=None, help="the label naming the pod (default: pod, else "
                        "kubernetes_pod_name)")
    export.set_defaults(func=_canary_from_prometheus)
    # `status` and `bench` parse their own flags (see main); listed here for --help.
    sub.add_parser(
        "status", help="fleet view of every SpeculativeModel: -n/-A, -l SELECTOR, -o table|wide|json|yaml, --watch "
        "(`status --help`)", add_help=False,
    )
    sub.add_parser("bench", help="benchmarks, e.g. `bench tuner --profile FILE` (`bench tuner --help`)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:
        from specdec_operator.fleetview import status_main

        return status_main(argv[1:])
    if argv[:1] == ["bench"]:
        from specdec_operator.bench.cli import bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
