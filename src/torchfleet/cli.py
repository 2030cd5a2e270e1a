"""torchfleet preflight|collective|train|attach|status|logs|stop|report|goodput|hosts|checks|variables|fabric|transport|health|collection.

Exit status: 0 ok, 1 a check or the run failed, 2 usage or internal error. --json prints the
Result (see docs/api.md) on stdout and nothing else.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys

import yaml

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import checks as registry
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import rdma

from torchfleet import api, fabric_cli, health_cli, hosts_cli, html_report, rundirs
from torchfleet import variables as public_variables
from torchfleet.progress import Progress
from torchfleet.results import Result

OK, FAILED, ERROR = 0, 1, 2
SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$")
UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_var(text: str) -> tuple[str, object]:
    """KEY=VALUE; VALUE is read as YAML, so -e data_paths=[/a,/b] gives a list."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("-e takes KEY=VALUE, got %r" % text)
    try:
        return key, yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchfleet", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", help="Ansible inventory (default: the embedded "
                        "two-node loopback inventory)")
    common.add_argument("-e", "--extra-var", dest="vars", action="append", type=parse_var,
                        default=[], metavar="KEY=VALUE", help="a playbook variable (repeatable)")
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_argument("--runs-root", help="where run directories go (default ./runs)")
    for name, text in (("preflight", "check every host; changes nothing"),
                       ("collective", "preflight, then the collective test under torchrun"),
                       ("train", "preflight, then torchrun with the training script")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--nnodes", type=int, help="use the first N hosts of group nodes")
        p.add_argument("--spares", type=int, help="also check the K hosts after them; the run "
                       "uses the first N healthy ones")
        if name != "preflight":
            p.add_argument("--max-restarts", type=int, help="start the run again, at most R "
                           "times, with a spare in place of a host that failed it")
            p.add_argument("--restart-on", choices=("host", "any"), help="restart only a "
                           "failure a host explains (host, the default) or any failure")
            p.add_argument("--detach", action="store_true", default=None, help="return once "
                           "every rank runs; the hosts end the run alone (torchfleet attach ID)")
        p.add_argument("--run-id", help="name of the run directory (default: time + random)")
    p = sub.add_parser("stop", parents=[common], help="stop a run (or every run) on every host; "
                       "a detached run is then gathered and reported")
    p.add_argument("run_id", nargs="?", help="the run to stop; every torchfleet run if omitted")
    by_id = argparse.ArgumentParser(add_help=False)
    by_id.add_argument("-i", "--inventory", help="an inventory holding the run's hosts (default: "
                       "the hosts the run's record names)")
    by_id.add_argument("--runs-root", help="where run directories are (default ./runs)")
    p = sub.add_parser("attach", parents=[by_id], help="follow a detached run to its end, then "
                       "gather it and write its verdict (Ctrl-C leaves it running)")
    p.add_argument("run_id", help="the run's id")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = sub.add_parser("status", parents=[by_id], help="a run at a glance (its master's record); "
                       "without an id, the runs under runs/ with their phase")
    p.add_argument("run_id", nargs="?", help="the run's id")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p = sub.add_parser("logs", parents=[by_id], help="a rank's log: from its host while the run "
                       "goes on, from runs/<id>/logs once it was gathered")
    p.add_argument("run_id", help="the run's id")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, help="the rank (default 0)")
    which.add_argument("--host", help="a host of the run (its first rank)")
    p.add_argument("--tail", type=int, default=50, help="start with the last N lines (default "
                   "%(default)s)")
    p.add_argument("--follow", "-f", action="store_true", help="read on until the rank's host "
                   "ends its part of the run (Ctrl-C stops reading, never the run)")
    p = sub.add_parser("report", help="write a self-contained HTML report of a run")
    p.add_argument("run_dir", help="a run directory (runs/<run_id>)")
    p.add_argument("-o", "--output", help="HTML file (default RUN_DIR/report.html)")
    p = sub.add_parser("goodput", help="goodput over the runs under the runs root: the share "
                       "of wall time that became kept training, what each failure cause cost, "
                       "and the checkpoint interval that loses least")
    p.add_argument("--since", help="only the runs started this long ago or later (7d, 12h, "
                   "30m, 2w)")
    p.add_argument("--runs-root", help="where run directories are (default ./runs)")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p = sub.add_parser("hosts", help="the fleet's ledger per host: runs, incidents by kind, "
                       "score, quarantine and the last incident; release HOST ends a "
                       "quarantine, quarantine HOST --hours N starts one")
    p.add_argument("action", nargs="?", metavar="HOST|release|quarantine",
                   help="HOST: its incidents and what torchfleet did to it (the audit); "
                   "release HOST or quarantine HOST --hours N (default: list the hosts)")
    p.add_argument("host", nargs="?", help="the host to release or quarantine")
    p.add_argument("--hours", type=float, help="how long a quarantine by hand lasts")
    p.add_argument("--reason", default="", help="why (the quarantine's reason)")
    p.add_argument("--since", help="count runs and incidents of this long ago or later (7d, "
                   "12h, 30m, 2w); the score is always the whole decayed history")
    p.add_argument("--runs-root", help="where run directories are (default ./runs)")
    p.add_argument("--fleet-db", help="the ledger: a path (relative to the runs root) or a "
                   "postgresql:// URL (default %s in the runs root)" % hosts_cli.defaults.FLEET_DB)
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p = sub.add_parser("checks", help="list every check id: what it catches, the fix it names")
    p.add_argument("--markdown", action="store_true", help="as docs/checks.md's tables")
    p = sub.add_parser("variables", help="list every public variable: type, default, meaning")
    p.add_argument("--markdown", action="store_true", help="as docs/variables.md's table")
    p = sub.add_parser("fabric", help="this host's RDMA devices as torchfleet sees them, and "
                       "what network=auto would choose here")
    p.add_argument("--sysfs", default="/sys/class/infiniband",
                   help="where the RDMA devices are listed (default %(default)s)")
    p.add_argument("--hca", default="", help="NCCL_IB_HCA to apply (mlx5_0,mlx5_1:1, ^mlx5_2)")
    p.add_argument("--gid-index", default="", help="NCCL_IB_GID_INDEX to apply")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p = sub.add_parser("transport", help="what NCCL used, per rank, from NCCL_DEBUG=INFO logs")
    p.add_argument("logs", nargs="+", metavar="LOG", help="rank logs (stdout/stderr)")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p = sub.add_parser("health", help="node health verdicts of one host's saved outputs "
                       "(nvidia-smi -q, dmesg, amd-smi ...), as preflight decides them",
                       epilog=health_cli.USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="a directory of saved outputs (file names below)")
    p.add_argument("--host", default="", help="the host's name in the verdicts (default: DIR's name)")
    p.add_argument("--xid-window-s", type=int, default=None,
                   help="Xids of the log's last this many seconds (default 7200)")
    p.add_argument("--json", action="store_true", help="check records as in preflight.json")
    p = sub.add_parser("collection", help="the Ansible collection torchfleet.fleet")
    verb = p.add_subparsers(dest="verb", required=True)
    b = verb.add_parser("build", help="write DIR/torchfleet-fleet-<version>.tar.gz")
    b.add_argument("dir", help="output directory")
    return parser


def summary(result: Result) -> str:
    lines = ["torchfleet %s  (run %s, %s)" % (result.verdict, result.run_id, result.run_dir)]
    if result.detached and not result.hosts:
        lines += ["  %-16s torchfleet %s %s" % (what, verb, result.run_id) for what, verb in (
            ("at a glance:", "status"), ("a rank's log:", "logs --follow --rank 0"),
            ("follow, gather:", "attach"), ("stop it:", "stop"))]
    for h in result.hosts:
        if h.outcome:
            lines.append("  %-16s %s" % (h.host, h.outcome))
    for c in result.failures:
        lines.append("  %-16s %-18s %s\n  %-16s %-18s fix: %s" % (c.host, c.id, c.detail, "", "",
                                                                c.fix or "-"))
    for op, rows in result.busbw_by_op().items():
        best = max(rows, key=lambda r: r.size_bytes)
        lines.append("  %-16s busbw %.3g GB/s at %d B (median across ranks)"
                     % (op, best.busbw_median, best.size_bytes))
    return "\n".join(lines)


def checks_text(markdown: bool) -> str:
    """Every check of the registry (plugins/module_utils/reports/checks.py)."""
    if markdown:
        return "\n\n".join(registry.markdown(phases) for phases in registry.TABLES)
    return "\n".join("%s  [%s]\n    catches: %s\n    fix: %s" % (
        ", ".join(u.ids), u.phase, u.catches, u.fix) for u in registry.REGISTRY)


def fabric_command(args: argparse.Namespace) -> int:
    try:
        if args.command == "fabric":
            hca = args.hca.strip()
            if hca and not rdma.HCA_SPEC.match(hca):
                raise ValueError("--hca %s is not NCCL_IB_HCA's form (names with an optional "
                                 ":port, comma separated, behind an optional ^ or =)" % hca)
            if args.gid_index and not rdma.is_gid_index(args.gid_index):
                raise ValueError("--gid-index %s is not a GID table index (0-255)"
                                 % args.gid_index)
            view = fabric_cli.fabric_view(args.sysfs, hca, args.gid_index)
            text = fabric_cli.fabric_text(view)
        else:
            view = fabric_cli.transport_view(args.logs)
            text = fabric_cli.transport_text(view)
    except ValueError as exc:
        print("torchfleet %s: %s" % (args.command, exc), file=sys.stderr)
        return ERROR
    except OSError as exc:
        print("torchfleet %s: cannot read %s: %s" % (args.command, exc.filename, exc.strerror),
              file=sys.stderr)
        return ERROR
    print(fabric_cli.as_json(view) if args.json else text)
    return OK


def health_command(args: argparse.Namespace) -> int:
    if args.xid_window_s is not None and args.xid_window_s < 0:
        print("torchfleet health: --xid-window-s %d is negative; give seconds >= 0"
              % args.xid_window_s, file=sys.stderr)
        return ERROR
    try:
        view = health_cli.health_view(args.source, args.host, args.xid_window_s)
    except ValueError as exc:
        print("torchfleet health: %s" % exc, file=sys.stderr)
        return ERROR
    print(health_cli.as_json(view) if args.json else health_cli.health_text(view))
    return health_cli.exit_status(view)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "checks":
        print(checks_text(args.markdown))
        return OK
    if args.command == "variables":
        print(public_variables.markdown() if args.markdown else public_variables.docs())
        return OK
    if args.command in ("fabric", "transport"):
        return fabric_command(args)
    if args.command == "health":
        return health_command(args)
    if args.command == "collection":
        from torchfleet import collection

        try:
            print(collection.build(args.dir))
        except (RuntimeError, OSError) as exc:
            print("torchfleet collection build: %s" % exc, file=sys.stderr)
            return ERROR
        return OK
    if args.command == "report":
        try:
            path = html_report.write(args.run_dir, args.output)
        except (ValueError, OSError) as exc:
            print("torchfleet report: %s" % exc, file=sys.stderr)
            return ERROR
        print(path)
        return OK
    if args.command in ("status", "logs"):
        return by_id_command(args)
    if args.command == "goodput":
        return goodput_command(args)
    if args.command == "hosts":
        return hosts_command(args)
    if args.command == "attach":
        progress = Progress(sys.stderr) if not args.json else None
        try:
            with progress or contextlib.nullcontext():
                result = api.attach(args.run_id, args.inventory, runs_root=args.runs_root,
                                    on_event=progress)
        except (ValueError, TypeError) as exc:
            print("torchfleet attach: %s" % exc, file=sys.stderr)
            return ERROR
        return finish(args, result)
    variables = dict(args.vars)
    for name in ("nnodes", "spares", "max_restarts", "restart_on", "detach"):
        if getattr(args, name, None) is not None:
            variables[name] = getattr(args, name)
    # --json keeps stderr quiet too: what it prints is the whole answer.
    progress = Progress(sys.stderr) if not args.json else None
    try:
        with progress or contextlib.nullcontext():
            if args.command == "stop":
                result = api.stop(args.run_id, inventory=args.inventory,
                                  runs_root=args.runs_root, **variables)
            else:
                call = getattr(api, args.command)
                result = call(args.inventory, on_event=progress, runs_root=args.runs_root,
                              run_id=args.run_id, variables=variables)
    except (ValueError, TypeError) as exc:
        print("torchfleet %s: %s" % (args.command, exc), file=sys.stderr)
        return ERROR
    if args.command == "stop":  # stopped as asked: the stopped run's verdict is no error
        finish(args, result)
        return OK if result.ansible_status == "successful" else ERROR
    return finish(args, result)


def finish(args: argparse.Namespace, result: Result) -> int:
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(summary(result))
    if any(c.id == "ansible.error" for c in result.checks):
        return ERROR
    return OK if result.ok else FAILED


def parse_since(text: str) -> float:
    """7d, 12h, 30m (or 30min), 90s, 2w: seconds; ValueError in one sentence otherwise."""
    match = SINCE.match(text)
    seconds = float(match.group(1)) * UNIT_S[match.group(2)] if match else 0.0
    if not seconds:
        raise ValueError("--since takes a positive number and a unit (s, m, h, d or w), such "
                         "as 7d or 12h; got %r" % text)
    return seconds


def goodput_text(view: dict) -> str:
    """torchfleet goodput for people: the figure, its buckets, failures by cause, advice."""
    since = " started in the last %s" % goodput.duration(view["since_s"]) \
        if view["since_s"] else ""
    if not view["runs"]:
        lines = ["no run with a goodput under %s%s" % (view["runs_root"], since)]
    else:
        lines = ["goodput %.1f %% over %d run%s%s: %s kept of %s" % (
            view["ratio"] * 100, view["runs"], "" if view["runs"] == 1 else "s", since,
            goodput.duration(view["kept_s"]), goodput.duration(view["wall_s"]))]
        wall = view["wall_s"] or 1.0
        rows = [(name.replace("_", " "), goodput.duration(value), "%.1f %%" % (100 * value / wall))
                for name, value in view["buckets"].items()]
        lines += ["", render(["bucket", "time", "share"], rows)]
        if view["lost_work_unknown_runs"]:
            lines.append("lost work unknown in %d run%s (no checkpoint_dir): counted as kept; "
                         "give -e checkpoint_dir=<where the script saves>" % (
                             view["lost_work_unknown_runs"],
                             "" if view["lost_work_unknown_runs"] == 1 else "s"))
        if view["failures"]:
            # Per host-hour, then at each run size: an 8-host and a 512-host run fail apart.
            every = " (one every %s of one host's time)" % goodput.duration(
                view["mtbf_host_s"]) if view["mtbf_host_s"] else ""
            lines += ["", "%d failure%s%s" % (view["failures"], "" if view["failures"] == 1
                                               else "s", every),
                      render(["cause", "failures", "cost"], [
                          (c["check"], c["failures"], "%.2f h" % c["cost_h"])
                          for c in view["causes"]])]
            if view["mtbf_host_s"]:
                lines += ["", render(["hosts", "runs", "a failure every", "advice"], [
                    (s["nnodes"], s["runs"], goodput.duration(s["mtbf_s"]), s["advice"] or "-")
                    for s in view["sizes"]])]
        else:
            lines += ["", "no failure"]
    if view["skipped"]:
        lines.append("%d train.json skipped: unreadable, too large or not torchfleet's"
                     % view["skipped"])
    return "\n".join(lines)


def goodput_command(args: argparse.Namespace) -> int:
    try:
        since_s = parse_since(args.since) if args.since is not None else None
    except ValueError as exc:
        print("torchfleet goodput: %s" % exc, file=sys.stderr)
        return ERROR
    # The runs root as `torchfleet status` finds it.
    view = goodput.runs_goodput(str(api._runs_root(args.runs_root)), since_s=since_s)
    print(json.dumps(view, indent=2) if args.json else goodput_text(view))
    return OK


def hosts_command(args: argparse.Namespace) -> int:
    """torchfleet hosts [release HOST | quarantine HOST --hours N]: a ledger that cannot be
    used is an error here (it is what was asked for), never in a run."""
    if args.action not in (None, "release", "quarantine"):  # torchfleet hosts HOST
        args.action, args.host, shown = ("show" if args.host is None else "bad"), \
            args.action, args.host
    where = "torchfleet hosts" + (" " + args.action if args.action else "")
    try:
        if args.action == "bad":
            raise ValueError("give HOST alone, release HOST or quarantine HOST --hours N "
                             "(not %s)" % shown)
        since_s = parse_since(args.since) if args.since is not None else None
        if args.action in ("release", "quarantine") and not args.host:
            raise ValueError("%s takes the host's name" % args.action)
        if args.action == "quarantine" and not (args.hours and args.hours > 0):
            raise ValueError("quarantine takes --hours N (N > 0)")
        if not args.action and args.host:
            raise ValueError("give release HOST or quarantine HOST --hours N")
    except ValueError as exc:
        print("%s: %s" % (where, exc), file=sys.stderr)
        return ERROR
    root = str(api._runs_root(args.runs_root))
    if hosts_cli.missing(args.fleet_db, root):  # (a wrong directory: nothing made, nothing said done)
        if args.action is None:  # the listing of a fleet with none yet: nothing to list
            db = args.fleet_db or hosts_cli.defaults.FLEET_DB
            return hosts_cli.nothing_yet(hosts_cli.sqlite_path(db, root)
                                         or hosts_cli.ledger_store.describe(db), args.json)
        print("%s: %s" % (where, hosts_cli.missing(args.fleet_db, root)), file=sys.stderr)
        return ERROR
    fleet = hosts_cli.open_fleet(args.fleet_db, root)
    try:
        # A host no run named yet may be quarantined (before its first run); not released.
        unseen = args.action == "quarantine" and not fleet.known(args.host)
        unknown = hosts_cli.unknown(fleet, args.host) \
            if args.host and args.action != "quarantine" else ""
        if unknown:
            print("%s: %s" % (where, unknown), file=sys.stderr)
            return ERROR
        if args.action == "release":
            done = fleet.release(args.host)
            said = "%s released: its incidents so far no longer count" % args.host
            if done:  # and its Slurm node resumed where torchfleet drained it, and only there
                resumed, ok = hosts_cli.undrain(args.host)
                said += "; " + resumed if resumed else ""
                fleet.record_actions(*hosts_cli.release_audit(args.host, resumed, ok))
        elif args.action == "quarantine":
            done = fleet.quarantine(args.host, args.hours, args.reason or "quarantined by hand "
                                    "(torchfleet hosts quarantine)")
            until = fleet.health([args.host])[args.host]["quarantined_until"]
            said = "%s quarantined until %s%s" % (args.host, hosts_cli.ledger.iso(until),
                                                  " (not seen in any run yet)" if unseen else "")
        if args.action in ("release", "quarantine") and done:
            said += hosts_cli.textfile(fleet)
        elif args.action == "show":
            row = next((h for h in fleet.hosts(since_s=since_s) if h["host"] == args.host),
                       None)
            history = fleet.history(args.host, since_s=since_s)
            done = not fleet.warnings
            said = json.dumps(dict(history, host=args.host, row=row), indent=2) if args.json \
                else hosts_cli.host_text(args.host, row, history)
        else:
            listed = fleet.hosts(since_s=since_s)
            done = not fleet.warnings
            # The table, then the failures most hosts shared (no host's strike: docs/ledger.md).
            said = hosts_cli.as_json(listed) if args.json else hosts_cli.hosts_text(
                listed, fleet.where, since_s, fleet.events(since_s=since_s))
    finally:
        fleet.close()
    if args.action is None and fleet.absent:  # a PostgreSQL database no run has written yet
        return hosts_cli.nothing_yet(fleet.where, args.json)
    if fleet.warnings or not done:
        for line in fleet.warnings or ["the ledger was not changed"]:
            print("%s: %s" % (where, line), file=sys.stderr)
        return ERROR
    for line in fleet.notes:
        print("%s: %s" % (where, line), file=sys.stderr)
    print(said)
    return OK


def by_id_command(args: argparse.Namespace) -> int:
    """status and logs: what they print is the answer (no progress)."""
    try:
        if args.command == "status" and args.run_id is None:
            listed = api.runs(args.runs_root)
            if args.json:
                print(json.dumps([dataclasses.asdict(r) for r in listed], indent=2))
            else:
                for r in listed:
                    print("%-28s %-10s %-10s %s" % (r.run_id, r.kind, r.phase, r.verdict))
            return OK
        if args.command == "status":
            status = api.status(args.run_id, args.inventory, runs_root=args.runs_root)
            print(json.dumps(status.to_dict(), indent=2) if args.json else rundirs.text(status))
            return OK
        api.logs(args.run_id, args.inventory, rank=args.rank, host=args.host, tail=args.tail,
                 follow=args.follow, runs_root=args.runs_root, on_text=write_out)
        return OK
    except (ValueError, TypeError) as exc:
        print("torchfleet %s: %s" % (args.command, exc), file=sys.stderr)
        return ERROR


def write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
