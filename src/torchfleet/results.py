"""Typed results of torchfleet runs, read from the JSON files the playbooks write.

preflight.json, collective.json and train.json are the contract (see docs/outputs.md);
these classes only give them names and types, so callers never parse Ansible's stdout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.report import verdict as _verdict  # the one renderer of how a run ended
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput as _goodput  # the one goodput line
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import read_json  # the one JSON reader, shared with the modules



@dataclass(frozen=True)
class Check:
    """One verdict: a check id on a host ("controller" for cross-host ones). The fields are
    the JSON reports' own: {"id", "host", "ok", "severity", "detail", "hint"}."""

    host: str
    id: str
    ok: bool
    detail: str
    hint: str = ""
    severity: str = "error"
    gpu: int | None = None  # the GPU a health check is about (gpu.*), where it is one

    @property
    def fix(self) -> str:
        """The fix sentence (the JSON's hint), under the name docs/checks.md's tables use."""
        return self.hint

    @classmethod
    def from_json(cls, raw: dict) -> "Check":
        return cls(host=raw["host"], id=raw["id"], ok=bool(raw["ok"]),
                   detail=raw.get("detail", ""), hint=raw.get("hint", ""),
                   severity=raw.get("severity", "error"),
                   gpu=raw["gpu"] if isinstance(raw.get("gpu"), int) else None)


@dataclass(frozen=True)
class Host:
    """A node of the run: preflight facts, or how its torchrun ended."""

    host: str
    node_rank: int | None = None
    address: str | None = None
    socket_ifname: str | None = None
    gpus: int | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    rc: int | None = None
    duration_s: float | None = None
    logs: str | None = None
    # Collective test: this host's ranks' busbw at the sweep's largest all_reduce size
    # ({op, size_bytes, min, median, max}).
    busbw_gbs: dict[str, Any] | None = None
    # With NCCL's INFO lines (nccl.transport): what this host's ranks used ({network, devices,
    # transports, gdr, ...}; plugins/module_utils/host/nccl_log.py).
    transport: dict[str, Any] | None = None


@dataclass(frozen=True)
class Rank:
    """How one rank ended: state is succeeded, failed, killed (by a signal) or stopped."""

    rank: int | None
    host: str
    local_rank: int
    ok: bool
    exit_code: int | None
    state: str


@dataclass(frozen=True)
class BusbwRow:
    """One op at one message size across ranks (nccl-tests' columns)."""

    op: str
    size_bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_min: float
    busbw_median: float
    busbw_max: float
    wrong: int
    slowest_host: str | None
    slowest_rank: int | None


@dataclass(frozen=True)
class Pair:
    """Two hosts measured against each other in the pair rounds (collective_isolate)."""

    a: str
    b: str
    busbw_gbs: float | None
    latency_us: float | None
    error: str | None
    slow: bool


@dataclass(frozen=True)
class Isolation:
    """The pair rounds' verdict: the slow hosts (node.slow) and links (link.slow)."""

    schedule: str
    rounds: int
    time_s: float
    threshold: float
    reference_gbs: float | None
    pairs: list[Pair]
    slow_nodes: list[str]
    slow_links: list[tuple[str, str]]


@dataclass(frozen=True)
class Straggler:
    """A rank the Flight Recorder's positions name: it never joined the collective (op is
    empty), or called op there instead."""

    host: str
    rank: int
    op: str = ""
    bytes: int | None = None


@dataclass(frozen=True)
class Collective:
    """Where the ranks were in their collectives when the run failed (flight.finding(), read
    from the master's record): the collective at which they diverge (seq, op, bytes, group),
    the ranks that never joined it (missing) or called another (mismatch); note says why
    nobody is named; others, where the other ranks were when a rank died."""

    seq: int | None
    op: str
    group: str | None
    bytes: int | None
    missing: list[Straggler]
    mismatch: list[Straggler]
    note: str = ""
    others: str = ""


def _collective(data: dict | None) -> Collective | None:
    if not data:
        return None
    return Collective(
        seq=data.get("seq"), op=data.get("op") or "", group=data.get("group"),
        bytes=data.get("bytes"),
        missing=[Straggler(m["host"], m["rank"]) for m in data.get("missing") or []],
        mismatch=[Straggler(m["host"], m["rank"], m.get("op", ""), m.get("bytes"))
                  for m in data.get("mismatch") or []],
        note=data.get("note") or "", others=data.get("others") or "")


@dataclass(frozen=True)
class Failure:
    """The first thing that went wrong in a launched run, as the master's record judged it
    (runstate.py), with its log tail. host is None for a failure of the run as a whole (a hang,
    the job's time limit, the controller's lease); exit_code is the failing rank's; collective,
    what the ranks' collectives said (None where the record has no recording); event, the
    hardware event of a run.hardware or run.oom cause (source, kind, code, gpu, pci_bus, rank,
    pid, line, fatal, at); names_host: reason is a sentence that names the host itself."""

    host: str | None
    rank: int | None
    reason: str
    tail: str = ""
    exit_code: int | None = None
    consequence: bool = False
    collective: Collective | None = None
    event: dict[str, Any] | None = None
    names_host: bool = False


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run with max_restarts, as its own record says it ended: its hosts in
    rank order, phase (succeeded, lost, failed, ...), each host's outcome, the first failure in
    words, why the next attempt was started (restart, with the hosts it replaced) or why not."""

    attempt: int
    hosts: list[str]
    phase: str
    ok: bool
    outcomes: dict[str, str]
    first_failure: str
    restart: str
    not_restarted: str
    replaced: list[dict[str, Any]]
    logs: str


@dataclass(frozen=True)
class GoodputBuckets:
    """Where a run's (or an attempt's) wall time went, in seconds; they add up to the wall time
    (docs/goodput.md says what each one is). lost_work is None when it is unknown (no
    checkpoint_dir)."""

    preflight: float = 0.0
    launch: float = 0.0
    init: float = 0.0
    kept_training: float = 0.0
    checkpoint_stall: float = 0.0
    lost_work: float | None = 0.0
    detection: float = 0.0
    teardown: float = 0.0
    restart: float = 0.0


@dataclass(frozen=True)
class GoodputAttempt:
    attempt: int
    buckets: GoodputBuckets


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint the agents saw complete in checkpoint_dir: its path there, when its writing
    began and ended (the controller's clock, epoch seconds) and its step (from its name)."""

    path: str
    began: float | None
    ended: float | None
    step: int | None


@dataclass(frozen=True)
class GoodputFailure:
    """A failure that ended an attempt: its check id (run.exit, host.lost, run.hardware, ...),
    host, when (the controller's clock) and what it cost (lost work, detection, restart and the
    next attempt's launch and init)."""

    attempt: int
    check: str
    host: str
    at: float | None
    cost_s: float


@dataclass(frozen=True)
class Goodput:
    """train.json's goodput: the share of the wall time (from the run's first play to its end)
    that became training that was kept (ratio, 0 to 1), the buckets of the whole run and of each
    attempt, what is unknown and why, the checkpoints seen, the failures and what each cost, and
    the checkpoint interval that loses least (advice, '' when the one used is close enough)."""

    ratio: float
    wall_s: float
    buckets: GoodputBuckets
    unknown: list[str] = field(default_factory=list)
    attempts: list[GoodputAttempt] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    failures: list[GoodputFailure] = field(default_factory=list)
    advice: str = ""
    save_s: float | None = None
    interval_s: float | None = None
    mtbf_s: float | None = None
    live: bool = False

    @property
    def line(self) -> str:
        """One line, as `torchfleet status` and the live progress say it: "goodput 91 %; 1
        restart cost 4 min 10 s: 2 min lost since the last checkpoint"."""
        from dataclasses import asdict

        return _goodput.line(asdict(self))


def _buckets(raw: Any) -> GoodputBuckets:
    raw = raw if isinstance(raw, dict) else {}
    return GoodputBuckets(**{k: raw[k] for k in GoodputBuckets.__dataclass_fields__ if k in raw})


def _goodput_of(raw: Any) -> Goodput | None:
    """The report's goodput object, typed (None where the report has none)."""
    if not isinstance(raw, dict):
        return None
    return Goodput(
        ratio=float(raw.get("ratio") or 0.0), wall_s=float(raw.get("wall_s") or 0.0),
        buckets=_buckets(raw.get("buckets")), unknown=list(raw.get("unknown") or []),
        attempts=[GoodputAttempt(a.get("attempt", 0), _buckets(a.get("buckets")))
                  for a in raw.get("attempts") or []],
        checkpoints=[Checkpoint(str(c.get("path", "")), c.get("began"), c.get("ended"),
                                c.get("step")) for c in raw.get("checkpoints") or []],
        failures=[GoodputFailure(f.get("attempt", 0), str(f.get("check", "")),
                                 str(f.get("host", "")), f.get("at"),
                                 float(f.get("cost_s") or 0.0))
                  for f in raw.get("failures") or []],
        advice=str(raw.get("advice") or ""), save_s=raw.get("save_s"),
        interval_s=raw.get("interval_s"), mtbf_s=raw.get("mtbf_s"), live=bool(raw.get("live")))


@dataclass
class Result:
    """What a torchfleet call returns. ok is False whenever any check failed or the run was
    cancelled; `checks` then names the host, the check and the fix."""

    kind: str
    ok: bool
    run_id: str
    run_dir: Path
    checks: list[Check] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)
    ranks: list[Rank] = field(default_factory=list)
    busbw: list[BusbwRow] = field(default_factory=list)
    isolation: Isolation | None = None
    first_failure: Failure | None = None
    # Hosts with a fatal hardware cause ({host, reason, evidence}) and every hardware event.
    drain: list[dict[str, Any]] = field(default_factory=list)
    hardware: list[dict[str, Any]] = field(default_factory=list)
    # {host: warnings not kept} (a fatal event is never dropped): "and N more warnings".
    hardware_dropped: dict[str, int] = field(default_factory=dict)
    # The stragglers the master named ({host, ranks, late_ms_mean, interval_ms, share_last,
    # late_ms_median, first_seen, last_seen}) and how they were watched ({watched, signal,
    # started, ended}).
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    straggle: dict[str, Any] = field(default_factory=dict)
    # What torchfleet did on its own, or would have ({action, host, check, at, why, done}: the
    # report's `actions`, docs/outputs.md).
    actions: list[dict[str, Any]] = field(default_factory=list)
    preflight: Result | None = None
    attempts: list[Attempt] = field(default_factory=list)
    # Of a train run (and of a collective test that could restart): where its wall time went.
    goodput: Goodput | None = None
    cancelled: bool = False
    # A detached run (detach=true): it runs on its hosts alone; attach(run_id) follows it.
    detached: bool = False
    ansible_status: str = ""
    ansible_rc: int | None = None

    @property
    def verdict(self) -> str:
        """How it ended, in one sentence: the sentence of the play and of the JSON report,
        rendered by the same function (plugins/module_utils/reports/report.py)."""
        if self.detached and not self.hosts:  # no report yet: the run goes on
            return "%s detached: run %s goes on on its hosts (torchfleet attach %s)" % (
                self.kind, self.run_id, self.run_id)
        checks = [c for c in self.preflight.checks if not c.ok] if self.preflight else []
        checks += self.checks
        failure = self.first_failure
        return _verdict(self.kind, [{"host": c.host, "id": c.id, "ok": c.ok,
                                     "severity": c.severity, "detail": c.detail}
                                    for c in checks],
                        None if failure is None else {"host": failure.host, "rank": failure.rank,
                                                      "reason": failure.reason,
                                                      "names_host": failure.names_host},
                        [{"restart": a.restart, "not_restarted": a.not_restarted}
                         for a in self.attempts])

    @property
    def failures(self) -> list[Check]:
        """Failed error-level checks, of this run and of its preflight."""
        own = [c for c in self.checks if not c.ok and c.severity == "error"]
        return (self.preflight.failures if self.preflight else []) + own

    def busbw_by_op(self) -> dict[str, list[BusbwRow]]:
        table: dict[str, list[BusbwRow]] = {}
        for row in self.busbw:
            table.setdefault(row.op, []).append(row)
        return table

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the schema of `torchfleet ... --json` (see docs/outputs.md)."""
        from dataclasses import asdict

        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        if self.preflight is not None:
            data["preflight"] = self.preflight.to_dict()
        data["failures"] = [asdict(c) for c in self.failures]
        data["verdict"] = self.verdict
        return data


def _host(raw: dict) -> Host:
    return Host(host=raw["host"], node_rank=raw.get("node_rank"), address=raw.get("address"),
                socket_ifname=raw.get("socket_ifname"), gpus=raw.get("gpus"),
                versions=raw.get("versions") or {}, outcome=raw.get("outcome"), rc=raw.get("rc"),
                duration_s=raw.get("duration_s"), logs=raw.get("logs"),
                busbw_gbs=raw.get("busbw_gbs"), transport=raw.get("transport"))


def _rank(raw: dict) -> Rank:
    return Rank(rank=raw.get("rank"), host=raw["host"], local_rank=raw.get("local_rank", 0),
                ok=bool(raw.get("ok")), exit_code=raw.get("exit_code"),
                state=raw.get("state", "succeeded" if raw.get("ok") else "unknown"))


def _busbw(raw: dict) -> BusbwRow:
    return BusbwRow(op=raw["op"], size_bytes=raw["size_bytes"], count=raw["count"],
                    time_us=raw["time_us_max"], algbw_gbs=raw["algbw_gbs_min"],
                    busbw_min=raw["busbw_gbs_min"], busbw_median=raw["busbw_gbs_median"],
                    busbw_max=raw["busbw_gbs_max"], wrong=raw["wrong"],
                    slowest_host=raw.get("slowest_host"), slowest_rank=raw.get("slowest_rank"))


def _isolation(raw: dict | None) -> Isolation | None:
    if not raw:
        return None
    return Isolation(
        schedule=raw["schedule"], rounds=raw["rounds"], time_s=raw["time_s"],
        threshold=raw["threshold"], reference_gbs=raw.get("reference_gbs"),
        pairs=[Pair(a=p["a"], b=p["b"], busbw_gbs=p.get("busbw_gbs"),
                    latency_us=p.get("latency_us"), error=p.get("error"), slow=bool(p["slow"]))
               for p in raw.get("pairs", [])],
        slow_nodes=list(raw.get("slow_nodes", [])),
        slow_links=[(a, b) for a, b in raw.get("slow_links", [])])


def from_report(kind: str, data: dict, run_dir: Path) -> Result:
    """A Result from the parsed contents of <kind>.json."""
    failure = data.get("first_failure")
    return Result(
        kind=kind, ok=bool(data.get("ok")), run_id=data.get("run_id", run_dir.name),
        run_dir=run_dir, checks=[Check.from_json(c) for c in data.get("checks", [])],
        hosts=[_host(h) for h in data.get("hosts", [])],
        ranks=[_rank(r) for r in data.get("ranks", [])],
        busbw=[_busbw(b) for b in data.get("busbw", [])],
        isolation=_isolation(data.get("isolate")),
        first_failure=Failure(host=failure.get("host"), rank=failure.get("rank"),
                              reason=failure.get("reason", ""), tail=failure.get("tail", ""),
                              exit_code=failure.get("exit_code"),
                              consequence=bool(failure.get("consequence")),
                              collective=_collective(failure.get("collective")),
                              event=failure.get("event"),
                              names_host=bool(failure.get("names_host")))
        if failure else None,
        drain=list(data.get("drain") or []), hardware=list(data.get("hardware") or []),
        hardware_dropped=dict(data.get("hardware_dropped") or {}),
        stragglers=list(data.get("stragglers") or []), straggle=dict(data.get("straggle") or {}),
        actions=[a for a in data.get("actions") or [] if isinstance(a, dict)],
        attempts=[Attempt(attempt=a["attempt"], hosts=list(a.get("hosts", [])),
                          phase=a.get("phase", ""), ok=bool(a.get("ok")),
                          outcomes=dict(a.get("outcomes") or {}),
                          first_failure=a.get("first_failure", ""), restart=a.get("restart", ""),
                          not_restarted=a.get("not_restarted", ""),
                          replaced=list(a.get("replaced") or []), logs=a.get("logs", ""))
                  for a in data.get("attempts", [])],
        goodput=_goodput_of(data.get("goodput")))




def load(run_dir: Path | str, kind: str | None = None) -> Result | None:
    """The Result of the run in run_dir: its train/collective report with the preflight inside,
    or the preflight alone. None when the run wrote nothing (it never reached its report)."""
    run_dir = Path(run_dir)
    pre = read_json(run_dir / "preflight.json")
    preflight = from_report("preflight", pre, run_dir) if pre else None
    kinds = [kind] if kind and kind != "preflight" else ([] if kind else ["collective", "train"])
    for k in kinds:
        data = read_json(run_dir / (k + ".json"))
        if data:
            result = from_report(k, data, run_dir)
            result.preflight = preflight
            result.ok = result.ok and (preflight is None or preflight.ok)
            return result
    return preflight
