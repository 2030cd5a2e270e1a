# -*- coding: utf-8 -*-
# The fleet ledger's options, as preflight_checks and run_summary take them (reports/memory.py's
# SPEC): written once for both modules' documentation.
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  fleet_db:
    description: The fleet's ledger (its public variable; the plays pass it, default C(fleet.db)), a SQLite path
      relative to the run directory's parent (the runs root) when relative, or a C(postgresql://) URL. Unset or
      empty, or without O(run_dir), no ledger is read or written. Not logged (a URL's password); the module's
      output shows the URL with its password masked.
    type: str
  ledger_half_life_h:
    description: A host's score in the ledger halves every this many hours.
    type: float
    default: 168.0
  quarantine_score:
    description: A host whose score reaches this when the ledger records the report is quarantined.
    type: float
    default: 2.5
  ledger_keep_days:
    description: The ledger keeps each incident, fleet event, action and run this many days, then deletes
      it at the next write; 0 keeps everything.
    type: int
    default: 90
  quarantine_h:
    description: How long a quarantine lasts.
    type: float
    default: 24.0
  actions:
    description: C(observe) records and scores and quarantines (drains, leaves out) no host;
      C(enforce) acts.
    type: str
    choices: [enforce, observe]
    default: enforce
  quarantine_max_fraction:
    description: The circuit breaker; at most this share of a group's hosts (at least one) is
      quarantined within quarantine_h, past it none is (fleet.breaker).
    type: float
    default: 0.1
  ledger_textfile:
    description: A Prometheus node-exporter textfile the ledger writes after recording (relative to the runs
      root when relative); none when empty.
    type: str
    default: ""
  ledger_root:
    description: The runs root a relative O(fleet_db) is read from (the run directory's parent when unset).
    type: str
  ledger_record:
    description: Whether this report is written into the ledger (a restart's re-check only reads it).
    type: bool
    default: true
"""
