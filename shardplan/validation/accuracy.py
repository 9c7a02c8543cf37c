"""The memory accuracy report: every expressible row of a runs CSV through ``fit``'s own path
(``check_config``, the contradiction rules, ``evaluate``), its prediction compared with what the
row measured, and the verdict compared with what happened (an OOM, or a run that completed).

Error of a row = predicted / measured - 1 for the counter it measured (``runs.COUNTER_CLASSES``):
peak allocated, peak reserved, device total; ``unnamed`` counters are compared with the peak
reserved (what torch's "peak memory" prints most often: torchtitan, torchtune's reserved column,
Trainer's nvidia-smi-free logs read lower). Statistics: median |error|, signed median, the 90th
percentile of |error| (nearest-rank), per counter class, per source and per stack x method x
engine class. False fit: a measured OOM answered ``fits``. False OOM: a run that completed
answered ``does_not_fit``. ``tight`` is counted on both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from shardplan.support.errors import ShardplanError
from shardplan.support.quantiles import error_stats
from shardplan.validation.runs import COUNTER_CLASSES, Row, RunQuery, Unexpressible

# which predicted number each counter class is compared with (FitResult.per_gpu fields)
PREDICTED_FIELD = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes",
                   "device_total": "device_total_bytes", "unnamed": "peak_reserved_bytes"}


@dataclass(frozen=True)
class Outcome:
    """One expressed row, judged."""

    row_id: str
    source: str
    row_type: str
    stack: str
    method: str
    engine_class: str
    counter: str | None
    measured_bytes: int | None
    predicted_bytes: int | None
    verdict: str

    @property
    def error(self) -> float | None:
        if not self.measured_bytes or self.predicted_bytes is None:
            return None
        return self.predicted_bytes / self.measured_bytes - 1.0

    @property
    def completed(self) -> bool:
        return self.row_type != "measured_oom"


def engine_class(strategy: str, engine: str) -> str:
    """'single' (one GPU, no wrapper), 'ddp', or the sharding engine."""
    return strategy if strategy in ("single", "ddp") else engine


def judge(query: RunQuery, evaluate: Callable | None = None, bands=None) -> Outcome | Unexpressible:
    """One row through fit's path: the configuration is checked as ``fit`` checks it, then
    evaluated; a configuration shardplan refuses is an ``Unexpressible`` with its one-line error."""
    from shardplan.inputs import contradictions
    from shardplan.planning import fit

    try:
        fit.check_config(query.spec, query.cluster, query.config)
        notes = contradictions.check(query.config, query.cluster, query.spec, searched=())
        result = (evaluate or fit.evaluate)(query.spec, query.cluster, query.config, notes, bands=bands)
    except ShardplanError as err:
        return Unexpressible(query.row_id, query.source, query.row_type, "rejected_by_shardplan", str(err)[:160])
    predicted = getattr(result.per_gpu, PREDICTED_FIELD[query.counter]) if query.counter else None
    return Outcome(query.row_id, query.source, query.row_type, result.config["stack"], result.config["method"],
                   engine_class(result.strategy, result.engine), query.counter, query.measured_bytes,
                   predicted, result.verdict)


def judge_all(rows: Iterable[Row], evaluate: Callable | None = None, bands=None) -> list[Outcome | Unexpressible]:
    """Every row: an ``Outcome``, or the ``Unexpressible`` it was (or became when shardplan refused it)."""
    return [judge(r, evaluate, bands) if isinstance(r, RunQuery) else r for r in rows]


def judge_out_of_source(rows: list[Row]) -> tuple[list[Outcome | Unexpressible], dict]:
    """Every row judged with the band fitted without its own source (``bands.loso``): the
    predictions do not depend on the band, so one pass gives the errors, a second the verdicts
    each row would get had its source not been seen. Returns (judged rows, bands per source)."""
    from shardplan.formulas.accuracy_bands import load_bands
    from shardplan.validation import bands as band_fit

    first = judge_all(rows)
    bands_of = band_fit.loso([o for o in first if isinstance(o, Outcome)], load_bands())
    queries = {r.row_id: r for r in rows if isinstance(r, RunQuery)}
    return [judge(queries[o.row_id], bands=bands_of[o.source]) if isinstance(o, Outcome) else o
            for o in first], bands_of


# --- statistics ----------------------------------------------------------------------------------------

def grouped(outcomes: list[Outcome], key: Callable[[Outcome], str]) -> dict[str, dict[str, Any]]:
    """``error_stats`` of the rows with a measured counter, per ``key``."""
    groups: dict[str, list[float]] = {}
    for o in outcomes:
        if o.error is not None:
            groups.setdefault(key(o), []).append(o.error)
    return {k: error_stats(v) for k, v in sorted(groups.items())}


def verdict_counts(outcomes: list[Outcome]) -> dict[str, int]:
    """False fits over measured OOMs, false OOMs over completed runs, and the tight answers."""
    ooms = [o for o in outcomes if not o.completed]
    done = [o for o in outcomes if o.completed]
    return {"ooms": len(ooms), "false_fits": sum(o.verdict == "fits" for o in ooms),
            "ooms_tight": sum(o.verdict == "tight" for o in ooms),
            "ooms_does_not_fit": sum(o.verdict == "does_not_fit" for o in ooms),
            "completed": len(done), "false_ooms": sum(o.verdict == "does_not_fit" for o in done),
            "completed_tight": sum(o.verdict == "tight" for o in done)}


def report(judged: list[Outcome | Unexpressible], bands_of: dict | None = None) -> dict[str, Any]:
    """The whole report as data (``render`` formats it); ``bands_of``: the bands each source's rows
    were judged with (``judge_out_of_source``), for the leave-one-source-out section."""
    outcomes = [o for o in judged if isinstance(o, Outcome)]
    extra = {} if bands_of is None else {"band": band_section(outcomes, bands_of)}
    refused: dict[str, int] = {}
    for r in judged:
        if isinstance(r, Unexpressible):
            refused[r.reason] = refused.get(r.reason, 0) + 1
    by_counter = grouped(outcomes, lambda o: o.counter or "")
    return {
        "rows": len(judged), "expressed": len(outcomes), "unexpressible": dict(sorted(refused.items())),
        "by_counter": {k: by_counter[k] for k in COUNTER_CLASSES if k in by_counter},
        "named": error_stats([o.error for o in outcomes if o.error is not None and o.counter != "unnamed"]),
        "by_source": grouped(outcomes, lambda o: o.source),
        "by_class": grouped(outcomes, lambda o: f"{o.stack} x {o.method} x {o.engine_class}"),
        "verdicts": verdict_counts(outcomes), **extra,
    }


def band_section(outcomes: list[Outcome], bands_of: dict) -> dict[str, Any]:
    """The shipped band fractions (fitted on every source) and their out-of-source coverage."""
    from shardplan.validation import bands as band_fit

    default, stacks = band_fit.fitted(outcomes)
    shipped = {"default": default, **stacks}
    return {"fitted": {k: {"upper": f.upper, "lower": f.lower, "rows": f.rows, "sources": list(f.sources)}
                       for k, f in shipped.items() if f is not None},
            "out_of_source": {s: {"upper": b.classes.unknown_stack.relative_error,
                                  "lower": b.classes.unknown_stack.lower_relative_error,
                                  "stacks": sorted(b.classes.unknown_stack.stacks)} for s, b in bands_of.items()},
            "coverage": band_fit.coverage(outcomes, bands_of)}


# --- the table -----------------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return "—" if x != x else f"{x * 100:+.1f} %" if x < 0 else f"{x * 100:.1f} %"


def _signed(x: float) -> str:
    return "—" if x != x else f"{x * 100:+.1f} %"


def _stats_table(title: str, groups: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"| {title} | rows | median abs error | signed median | p90 abs error | largest |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} | {s['n']} | {_pct(s['median_abs'])} | {_signed(s['signed_median'])} | "
              f"{_pct(s['p90_abs'])} | {_pct(s['max_abs'])} |" for name, s in groups.items()]
    return lines


def render(data: dict[str, Any], command: str) -> str:
    """The report as markdown (what docs/accuracy.md shows between its markers)."""
    v = data["verdicts"]
    rate = v["false_ooms"] / v["completed"] if v["completed"] else math.nan
    lines = [f"Generated by `{command}`: {data['rows']} rows, {data['expressed']} expressed "
             f"({sum(data['unexpressible'].values())} cannot be, by reason below). Error = predicted / measured − 1.", ""]
    lines += _stats_table("counter class", {**data["by_counter"], "named counters (all but unnamed)": data["named"]})
    lines += ["", "| verdict check | count |", "| --- | ---: |",
              f"| measured OOMs | {v['ooms']} |", f"| false fits (OOM answered `fits`) | {v['false_fits']} |",
              f"| OOMs answered `tight` | {v['ooms_tight']} |",
              f"| OOMs answered `does_not_fit` | {v['ooms_does_not_fit']} |",
              f"| completed runs | {v['completed']} |",
              f"| false OOMs (completed, answered `does_not_fit`) | {v['false_ooms']} ({_pct(rate)}) |",
              f"| completed runs answered `tight` | {v['completed_tight']} |", ""]
    lines += _stats_table("source", data["by_source"]) + [""]
    lines += _stats_table("stack x method x engine class", data["by_class"]) + [""]
    lines += ["| cannot be expressed | rows |", "| --- | ---: |"]
    lines += [f"| `{reason}` | {n} |" for reason, n in data["unexpressible"].items()]
    if "band" in data:
        lines += [""] + _band_lines(data["band"])
    return "\n".join(lines) + "\n"


def _band_lines(band: dict[str, Any]) -> list[str]:
    """The band's fitted fractions and their leave-one-source-out coverage."""
    cov = band["coverage"]
    lines = ["| band (unknown_stack class) | upper | lower | rows | sources |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {name} | {_pct(f['upper'])} | {_pct(f['lower'])} | {f['rows']} | {', '.join(f['sources'])} |"
              for name, f in band["fitted"].items()]
    lines += ["", "| held-out source | upper (default) | lower (default) | stacks with their own band |",
              "| --- | ---: | ---: | --- |"]
    lines += [f"| {s} | {_pct(b['upper'])} | {_pct(b['lower'])} | {', '.join(b['stacks']) or '—'} |"
              for s, b in band["out_of_source"].items()]
    lines += ["", f"Out-of-source coverage: {cov['inside']} of {cov['rows']} measured rows "
                  f"({_pct(cov['coverage'])}) lie within [predicted × (1 − lower), predicted × (1 + upper)] of the "
                  f"band fitted without their source; {cov['above_upper']} above it, {cov['below_lower']} below. "
                  f"The verdict checks above use those out-of-source bands."]
    return lines


DOCS_BEGIN = "<!-- BEGIN generated: {name} -->"
DOCS_END = "<!-- END generated: {name} -->"


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the block between the markers of section ``name`` replaced by ``body`` (the
    markers appended at the end when absent). Other helpers' generated sections use their own
    names and are left as they are."""
    begin, end = DOCS_BEGIN.format(name=name), DOCS_END.format(name=name)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip() + "\n\n" + block + "\n"


def render_rows(judged: list[Outcome | Unexpressible]) -> str:
    """Every row: its prediction, error and verdict, or why it cannot be expressed."""
    lines = ["| row | stack x method x engine | counter | measured GiB | predicted GiB | error | verdict |",
             "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for o in judged:
        if isinstance(o, Outcome):
            gib = [f"{b / 2**30:.2f}" if b is not None else "" for b in (o.measured_bytes, o.predicted_bytes)]
            error = _signed(o.error) if o.error is not None else ""
            lines.append(f"| {o.row_id} | {o.stack} x {o.method} x {o.engine_class} | {o.counter or o.row_type} | "
                         f"{gib[0]} | {gib[1]} | {error} | {o.verdict} |")
        else:
            lines.append(f"| {o.row_id} | cannot be expressed: {o.reason} | | | | | {o.detail[:60]} |")
    return "\n".join(lines) + "\n"


# lower is better for each of these; ``expressed`` is the one number where higher is better
HEADLINE_LOWER_IS_BETTER = ("median_abs", "p90_abs", "false_fits", "false_ooms")


def headline(data: dict[str, Any]) -> dict[str, Any]:
    """The numbers CI holds the report to (tests/test_accuracy_report.py): per counter class and
    for the named counters together, median and p90 |error|; false fits, false OOMs; rows expressed."""
    classes = {**data["by_counter"], "named": data["named"]}
    out: dict[str, Any] = {f"{name}.{stat}": round(s[stat], 6) for name, s in classes.items()
                           for stat in ("median_abs", "p90_abs") if s["n"]}
    out.update({"false_fits": data["verdicts"]["false_fits"], "false_ooms": data["verdicts"]["false_ooms"],
                "expressed": data["expressed"]})
    return out


def worse(now: dict[str, Any], committed: dict[str, Any], slack: float = 1e-6) -> list[str]:
    """What got worse than the committed numbers (a number gone missing counts as worse)."""
    out = []
    for key, before in committed.items():
        value = now.get(key)
        lower_better = key.rsplit(".", 1)[-1] in HEADLINE_LOWER_IS_BETTER
        if value is None or (value > before + slack if lower_better else value < before - slack):
            out.append(f"{key}: {before} -> {value}")
    return out
