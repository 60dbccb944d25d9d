"""Fleet view: one table of every SpeculativeModel's pools, gfx, drafter, K, acceptance, tokens/s, canary, Ready.

`render_table` is pure (objects in, text out) and reads `.status` only, so the table shows what the
operator observed and decided, never what the spec asks for. The rest lists the objects with
kubernetes_asyncio and drives the one-shot, `--watch` and kubectl-plugin entry points.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from pydantic import ValidationError

from specdec_operator import GROUP, PLURAL, VERSION
from specdec_operator.api.status import (
    CanaryStatus,
    Condition,
    DrafterChoice,
    PoolSpeculationStats,
    PoolStatus,
    SpeculativeModelStatus,
)
from specdec_operator.version import version_line

COLUMNS = ("NAMESPACE", "NAME", "POOL", "GFX", "DRAFTER", "K", "ACCEPTANCE", "TOKENS/S", "REPLICAS", "CANARY", "READY")
# -o wide: what an operator on call asks next (how long the accepted runs are, how much evidence, which
# revision and image run, on how many nodes).
WIDE_COLUMNS = (*COLUMNS, "ACCEPTED-LEN", "DRAFTS", "NODES", "REVISION", "IMAGE")
OUTPUTS = ("table", "wide", "json", "yaml")
MISSING = "-"
# Page size of the list calls: bounds one response on fleets with thousands of models.
_PAGE_SIZE = 500
_CLEAR_SCREEN = "\x1b[H\x1b[2J"

Row = tuple[str, ...]


def _drafter(choice: DrafterChoice) -> str:
    # The checkpoint's last path segment is the part that tells drafters apart in a narrow column.
    text = choice.method if not choice.model else f"{choice.method}:{choice.model.rstrip('/').rsplit('/', 1)[-1]}"
    return f"{text} (fallback)" if choice.fallback else text


def _k(pool: PoolStatus, stats: PoolSpeculationStats | None) -> str:
    # Showing where the tuner is heading makes convergence visible before the K change rolls out.
    if stats is not None and stats.recommended_k is not None and stats.recommended_k != pool.effective_k:
        return f"{pool.effective_k}->{stats.recommended_k}"
    return str(pool.effective_k)


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def _rate(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def _canary(canary: CanaryStatus | None, pool: str) -> str:
    if canary is None or canary.pool != pool:
        return MISSING
    return f"{canary.phase} {canary.weight}%"


def _ready(conditions: list[Condition]) -> str:
    ready = next((condition for condition in conditions if condition.type == "Ready"), None)
    if ready is None:
        return "Unknown"
    return ready.status if ready.status == "True" else f"{ready.status} ({ready.reason})"


def _wide(pool: PoolStatus, stats: PoolSpeculationStats | None) -> Row:
    length = stats.mean_accepted_length if stats else None
    return (
        MISSING if length is None else f"{length:.2f}",
        str(stats.drafts) if stats else MISSING,
        str(pool.nodes),
        pool.revision or MISSING,
        pool.image or MISSING,
    )


def _rows(obj: dict[str, Any], wide: bool = False) -> list[Row]:
    metadata = obj.get("metadata", {})
    identity = (str(metadata.get("namespace", MISSING)), str(metadata.get("name", MISSING)))
    blanks = (MISSING,) * (len(COLUMNS) - len(identity) - 1)
    extra_blanks = (MISSING,) * (len(WIDE_COLUMNS) - len(COLUMNS)) if wide else ()
    try:
        status = SpeculativeModelStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        # One object written by an incompatible operator version must not hide the rest of the fleet.
        return [(*identity, *blanks, "InvalidStatus", *extra_blanks)]
    ready = _ready(status.conditions)
    if not status.pools:
        return [(*identity, *blanks, ready, *extra_blanks)]
    stats_by_pool = {stats.pool: stats for stats in status.speculation.pools}
    rows: list[Row] = []
    for pool in status.pools:
        stats = stats_by_pool.get(pool.name)
        rows.append(
            (
                *identity,
                pool.name,
                pool.gfx_target,
                _drafter(pool.drafter),
                _k(pool, stats),
                _percent(stats.acceptance_rate if stats else None),
                _rate(stats.tokens_per_second if stats else None),
                f"{pool.ready_replicas}/{pool.replicas}",
                _canary(status.canary, pool.name),
                ready,
                *(_wide(pool, stats) if wide else ()),
            )
        )
    return rows


def _identity(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata", {})
    return str(metadata.get("namespace", MISSING)), str(metadata.get("name", MISSING))


def render_table(objs: list[dict[str, Any]], wide: bool = False) -> str:
    """A kubectl-style table with one row per pool (one row for a model without pools), sorted by model."""
    header = WIDE_COLUMNS if wide else COLUMNS
    ordered = sorted(objs, key=_identity)
    rows = [header, *(row for obj in ordered for row in _rows(obj, wide))]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


def render_objects(objs: list[dict[str, Any]], output: str) -> str:
    """`-o json|yaml`: the objects as the API server returned them, in a kubectl-style v1 List, sorted by model."""
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": sorted(objs, key=_identity)}
    if output == "json":
        return json.dumps(listed, indent=4) + "\n"
    return yaml.safe_dump(listed, sort_keys=False)


def render(objs: list[dict[str, Any]], output: str) -> str:
    if output in ("json", "yaml"):
        return render_objects(objs, output)
    return render_table(objs, wide=output == "wide")


def build_parser(prog: str = "specdec-operator status") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Table of every SpeculativeModel, read from status.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="namespace to list (default: the kubeconfig context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    parser.add_argument(
        "-l", "--selector", default=None,
        help="label selector, as kubectl takes it (e.g. team=ml,tier!=dev); the API server filters",
    )
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, default="table",
        help="table (default), wide (adds accepted length, drafts, nodes, revision, image), json or yaml "
        "(the SpeculativeModel objects)",
    )
    parser.add_argument("-w", "--watch", action="store_true", help="refresh the view until Ctrl-C")
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes with --watch (default 2)"
    )
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig file (default $KUBECONFIG)"
    )
    return parser


def _context_namespace(kubeconfig: str | None) -> str:
    _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
    namespace = (active or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else "default"


async def list_models(api: Any, namespace: str | None, selector: str | None = None) -> list[dict[str, Any]]:
    """Every SpeculativeModel in `namespace` (all namespaces when None) matching `selector`, following pagination."""
    objects = k8s_client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page_args: dict[str, Any] = {"limit": _PAGE_SIZE}
        if selector:
            page_args["label_selector"] = selector
        if token:
            page_args["_continue"] = token
        if namespace is None:
            page = await objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, **page_args)
        else:
            page = await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **page_args)
        items.extend(page.get("items", []))
        token = page.get("metadata", {}).get("continue")
        if not token:
            return items


def _describe_error(error: Exception) -> str:
    if isinstance(error, ApiException):
        if error.status == 404:
            return f"the SpeculativeModel CRD ({PLURAL}.{GROUP}) is not installed in this cluster"
        return f"the API server answered {error.status} {error.reason}"
    if isinstance(error, aiohttp.ClientError):
        return f"cannot reach the API server: {error}"
    return str(error)


_EXPECTED_ERRORS = (ApiException, aiohttp.ClientError, ConfigException, OSError)


async def _snapshot(api: Any, namespace: str | None, args: argparse.Namespace) -> str:
    models = await list_models(api, namespace, args.selector)
    if not models and args.output in ("table", "wide"):
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        matching = f" matching {args.selector}" if args.selector else ""
        return f"No SpeculativeModels found in {where}{matching}.\n"
    return render(models, args.output)


async def _watch(api: Any, namespace: str | None, args: argparse.Namespace, command: str, out: TextIO) -> None:
    clear = _CLEAR_SCREEN if out.isatty() else "\n"
    interval = args.interval
    while True:
        try:
            body = await _snapshot(api, namespace, args)
        except (ApiException, aiohttp.ClientError) as error:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Ctrl-C landed mid-request and the client reported it as its own timeout: the watch must
                # still stop (asyncio.run cancels this task on SIGINT and waits for it to end).
                raise asyncio.CancelledError from error
            # A watch outlives API server restarts and network blips: report and keep refreshing.
            body = f"error: {_describe_error(error)}\n"
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        out.write(f"{clear}Every {interval:g}s: {command}    {stamp}\n\n{body}")
        out.flush()
        await asyncio.sleep(interval)


async def _run(args: argparse.Namespace, command: str, out: TextIO) -> None:
    namespace = None if args.all_namespaces else (args.namespace or _context_namespace(args.kubeconfig))
    api = await k8s_config.new_client_from_config(config_file=args.kubeconfig, persist_config=False)
    async with api:
        if args.watch:
            await _watch(api, namespace, args, command, out)
        else:
            out.write(await _snapshot(api, namespace, args))


def status_main(argv: Sequence[str], prog: str = "specdec-operator status") -> int:
    """`specdec-operator status [-n NS | -A] [-l SELECTOR] [-o FORMAT] [--watch] [--interval S]`; the exit code."""
    parser = build_parser(prog)
    args = parser.parse_args(list(argv))
    if args.interval <= 0:
        parser.error("--interval must be positive")
    command = " ".join([prog, *argv])
    try:
        asyncio.run(_run(args, command, sys.stdout))
    except KeyboardInterrupt:
        return 0
    except _EXPECTED_ERRORS as error:
        sys.stderr.write(f"error: {_describe_error(error)}\n")
        return 1
    return 0


PLUGIN_HELP = """\
kubectl specdec: the fleet view of SpeculativeModels (specdec.io/v1alpha1), as a kubectl plugin.

Installed with the specdec-operator Python package, which puts the `kubectl-specdec` executable on PATH;
kubectl finds it there (`kubectl plugin list` shows it). It reads status only: what the operator observed
and decided (pools, gfx target, drafter, effective K and where the tuner heads, acceptance, tokens/s,
replicas, canary step, Ready), never what the spec asks for. It needs list on speculativemodels.specdec.io
in the namespaces it shows.

Usage:
  kubectl specdec                      every namespace (same as `kubectl specdec status -A`)
  kubectl specdec status [flags]       the view, with the flags below
  kubectl specdec [flags]              flags without a command go to `status`
  kubectl specdec --version            the plugin's version

Examples:
  kubectl specdec status -n inference -o wide
  kubectl specdec status -A -l team=ml-platform --watch
  kubectl specdec status -n inference -o json | jq '.items[].status.pools'

"""


def kubectl_plugin_main() -> None:
    """`kubectl specdec [status] [flags]`: kubectl runs the `kubectl-specdec` executable with the remaining words.

    Bare `kubectl specdec` shows every namespace; flags without a command go to `status`, the only one.
    """
    argv = sys.argv[1:]
    if not argv:
        argv = ["status", "-A"]
    elif argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(PLUGIN_HELP + build_parser("kubectl specdec status").format_help())
        sys.exit(0)
    elif argv[0] == "--version":
        sys.stdout.write(version_line("kubectl specdec") + "\n")
        sys.exit(0)
    elif argv[0].startswith("-"):
        argv = ["status", *argv]
    if argv[0] != "status":
        sys.stderr.write(f"error: unknown command {argv[0]!r}; the plugin knows `status` (kubectl specdec --help)\n")
        sys.exit(2)
    sys.exit(status_main(argv[1:], prog="kubectl specdec status"))
