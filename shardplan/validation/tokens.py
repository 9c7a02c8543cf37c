"""Tokens/s of published runs against shardplan's step time: the time half of the accuracy report.

Every row of ``tests/data/published_runs/runs.csv`` with a tokens/s number that ``runs.read_runs``
expresses as a query is predicted with ``fit.step_timings`` (the numbers ``fit
--global-batch-tokens`` answers: tests/test_fit_time.py) and compared: error = predicted / published − 1 (positive: the model is optimistic).

Grouped per source (the row-id prefix), per class (engine × strategy × method × GPU family ×
nodes) and per regime of the prediction:

* ``offload-bound``: host transfers + the CPU optimizer are ≥ 25 % of the step;
* ``communication-bound``: the step's collectives take ≥ a quarter of its compute time (what
  overlap must hide: multi-node, PCIe cards, large data-parallel degrees);
* ``compute-bound``: the rest.

One constant of the time model is fitted on these runs: the calibrated window factor on a step's
GPU seconds (``validation/window_factor.py``); each source is predicted with the factor fitted on
the other sources (``dev_set_rows``), so every error here is out of source. Nothing else is (the
GEMM shape fit comes from the H100 probes, link and latency figures from NCCL and the profiles).
The tokens/s band is two-sided from those errors (``band_quantiles``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from shardplan.formulas.accuracy_bands import FamilyBand, widened
from shardplan.inputs import hardware, time_calibration
from shardplan.support.quantiles import error_stats, quantile
from shardplan.validation.runs import RunQuery, read_runs

RUNS = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_runs" / "runs.csv"
OFFLOAD_SHARE = 0.25
COMM_SHARE = 0.25
BAND_QUANTILES = (0.10, 0.90)  # the band holds the middle 80 % of out-of-source errors


@dataclass(frozen=True)
class TokensRow:
    row_id: str
    source: str
    klass: str
    regime: str
    published: float
    predicted: float
    gpu_share: float = 1.0  # GPU seconds (compute + GPU optimizer) / step (window_factor.row_factor)
    window_factor: float = 1.0  # the factor it was predicted at
    family: str = ""  # the GPU family (hardware.gpu_family): the band an answer on it gets

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def run_class(q: RunQuery) -> str:
    nodes = "1 node" if q.cluster.nodes == 1 else "multi-node"
    return f"{q.config.engine} × {q.config.strategy} × {q.config.method} × {hardware.gpu_family(q.cluster.gpu.name)} × {nodes}"


def regime(t: dict, offloaded: bool) -> str:
    """The prediction's binding part (module docstring); an offloaded optimizer's step runs on the CPU."""
    host = t["offload_transfer_s"] + (t["optimizer_s"] if offloaded else 0.0)
    if host >= OFFLOAD_SHARE * t["step_time_s"]:
        return "offload-bound"
    if t["comm_s"] >= COMM_SHARE * t["compute_s"]:
        return "communication-bound"
    return "compute-bound"


def predict(queries: list[RunQuery], window_factor: float | dict[str, float] | None = None) -> list[TokensRow]:
    """The rows' predictions, one vectorized ``fit.step_timings`` call per row, at ``window_factor``
    (a number, a source -> number map, or None: the calibrated one answers use)."""
    from shardplan.planning.fit import step_timings

    out = []
    for q in queries:
        k = time_calibration.window_factor(window_factor.get(q.source, 1.0) if isinstance(window_factor, dict)
                                           else window_factor)
        t = step_timings(q.spec, q.cluster, [q.config], window_factor=k)[0]
        gpu = t["compute_s"] + (t["optimizer_s"] if q.config.offload == "none" else 0.0)
        out.append(TokensRow(q.row_id, q.source, run_class(q), regime(t, q.config.offload != "none"),
                             q.measured_tokens_per_s_per_gpu,
                             t["tokens_per_s_per_gpu"], gpu / t["step_time_s"], k, hardware.gpu_family(q.cluster.gpu.name)))
    return out


def with_tokens(runs) -> list[RunQuery]:
    """The expressible rows of ``read_runs``' output that have a tokens/s number."""
    return [r for r in runs if isinstance(r, RunQuery) and r.measured_tokens_per_s_per_gpu]


def dev_set_queries(path: Path = RUNS) -> list[RunQuery]:
    """Every expressible row of the runs CSV with a tokens/s number."""
    return with_tokens(read_runs(path))


def out_of_source(queries: list[RunQuery], at_one: list[TokensRow]) -> list[TokensRow]:
    """``queries`` predicted out of source: each source at the window factor fitted on the other
    sources (``window_factor.loso``) of the same rows predicted at k = 1 (``at_one``)."""
    from shardplan.validation import window_factor

    return predict(queries, window_factor.loso(at_one))


def dev_set_rows(path: Path = RUNS) -> list[TokensRow]:
    """Every expressible row of the runs CSV with a tokens/s number, predicted out of source
    (``out_of_source``)."""
    queries = dev_set_queries(path)
    return out_of_source(queries, predict(queries, window_factor=1.0))


def stats(errors) -> dict[str, float]:
    return error_stats(errors)


def grouped_rows(rows: list[TokensRow], key) -> dict[str, list[TokensRow]]:
    groups: dict[str, list[TokensRow]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return dict(sorted(groups.items()))


def grouped(rows: list[TokensRow], key) -> dict[str, dict[str, float]]:
    return {k: stats(r.error for r in v) for k, v in grouped_rows(rows, key).items()}


def band_quantiles(rows: list[TokensRow]) -> tuple[float, float]:
    """(slower, faster) for ``verdict.throughput_band`` (low = estimate / (1 + slower), high =
    estimate × (1 + faster)) from the 10th and 90th percentiles of the out-of-source errors
    (error = predicted / published − 1): slower = p90, faster = 1 / (1 + p10) − 1 (a run that
    published more than predicted). The band holds the middle 80 % of the development set."""
    lo, hi = (quantile([r.error for r in rows], q) for q in BAND_QUANTILES)
    return float(max(hi, 0.0)), float(max(1.0 / (1.0 + lo) - 1.0, 0.0))


# --- the report -----------------------------------------------------------------------------------
BEGIN, END = "<!-- tokens-per-s:begin -->", "<!-- tokens-per-s:end -->"
WORST_SIGNED = 0.10  # the bound on a class's |signed median|


def _table(title: str, groups: dict[str, dict[str, float]]) -> list[str]:
    lines = [f"| {title} | runs | median \\|error\\| | signed median | p90 \\|error\\| |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {k} | {v['n']} | {v['median_abs']:.1%} | {v['signed_median']:+.1%} | {v['p90_abs']:.1%} |"
              for k, v in groups.items()]
    return lines + [""]


def report_markdown(rows: list[TokensRow] | None = None) -> str:
    """The tokens/s section of docs/accuracy.md (between ``BEGIN`` and ``END``)."""
    return "\n".join([BEGIN, "", *report_lines(dev_set_rows() if rows is None else rows), "", END])


def report_lines(rows: list[TokensRow]) -> list[str]:
    """The tokens/s report of ``rows`` (out-of-source predictions): the headline with the band, then
    the tables per regime, source, GPU family and class, and the classes over ``WORST_SIGNED``."""
    if not rows:
        return ["No run with tokens/s that shardplan expresses."]
    overall = stats(r.error for r in rows)
    slower, faster = band_quantiles(rows)
    by_class = grouped(rows, lambda r: r.klass)
    off = [f"{k} ({v['signed_median']:+.1%}, {_runs(v['n'])})" for k, v in by_class.items()
           if abs(v["signed_median"]) > WORST_SIGNED]
    loso = ", ".join(f"{s} {k:.3f}" for s, k in sorted({r.source: r.window_factor for r in rows}.items()))
    lines = [f"{_runs(overall['n'])} with tokens/s: median |error| {overall['median_abs']:.1%}, signed median "
             f"{overall['signed_median']:+.1%}, p90 {overall['p90_abs']:.1%} (error = predicted / published − 1; "
             f"each source predicted at the window factor fitted on the other sources — {loso}; answers use the "
             "one calibrated on all of them, shardplan/data/time_calibration.json — so every error is out of "
             "source). Band: estimate / "
             f"(1 + {slower:.3f}) … estimate × (1 + {faster:.3f}), the 10th–90th percentiles.", ""]
    lines += _table("regime", grouped(rows, lambda r: r.regime))
    lines += _table("source", grouped(rows, lambda r: r.source))
    lines += _table("GPU family", grouped(rows, lambda r: r.family))
    lines += [_family_bands(rows, slower, faster), ""]
    lines += _table("engine × strategy × method × GPU × nodes", by_class)
    return lines + [f"Classes with |signed median| > {WORST_SIGNED:.0%}: {len(off)} of {len(by_class)}: "
                    + "; ".join(off) + "."]


def report_data(rows: list[TokensRow]) -> dict:
    """``report_lines``' numbers for JSON: overall, the band's fractions and the groups."""
    if not rows:
        return {"runs": 0}
    slower, faster = band_quantiles(rows)
    keys = {"regime": lambda r: r.regime, "source": lambda r: r.source, "gpu_family": lambda r: r.family,
            "class": lambda r: r.klass}
    return {"runs": len(rows), "overall": stats(r.error for r in rows),
            "band": {"slower_than_predicted": slower, "faster_than_predicted": faster},
            **{name: grouped(rows, key) for name, key in keys.items()}}


def csv_rows(runs: list, dev_runs: list | None = None) -> list[TokensRow]:
    """The tokens/s rows of a runs CSV's ``read_runs`` output, each predicted out of source: at the
    window factor fitted on the development set without the row's source (``window_factor.fitted``;
    a source the development set lacks gets the factor fitted on all of it, which none of its runs
    was in). ``dev_runs``: the development set already read (None: read here). On the development
    set itself these are ``dev_set_rows``."""
    from shardplan.validation import window_factor

    dev = predict(with_tokens(read_runs(RUNS) if dev_runs is None else dev_runs), window_factor=1.0)
    queries = with_tokens(runs)
    return predict(queries, {s: window_factor.fitted(dev, leave_out=s) for s in {q.source for q in queries}})


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def family_bands(rows: list[TokensRow]) -> dict[str, FamilyBand]:
    """Per GPU family, the ``band_quantiles`` of its rows alone (the band file's ``gpu_families``,
    written by tools/update_accuracy.py; ``ThroughputBand.fractions`` widens an answer by them)."""
    out = {}
    for family, group in grouped_rows(rows, lambda r: r.family).items():
        slower, faster = band_quantiles(group)
        out[family] = FamilyBand(slower_than_predicted=slower, faster_than_predicted=faster, runs=len(group),
                                 median_error=stats(r.error for r in group)["signed_median"])
    return out


def _family_bands(rows: list[TokensRow], slower: float, faster: float) -> str:
    """The sentence naming the GPU families whose own quantiles widen an answer's band."""
    base = FamilyBand(slower_than_predicted=slower, faster_than_predicted=faster, runs=len(rows), median_error=0.0)
    wider = [f"{family} /{1 + s:.3f} … ×{1 + f:.3f} ({_runs(own.runs)})"
             for family, own in family_bands(rows).items()
             for s, f in [widened(base, own)] if (s, f) != (slower, faster)]
    return ("An answer on a GPU family gets the same percentiles of that family's runs where they are wider, "
            "never narrower (`ThroughputBand.fractions`; `fit` says which): " + "; ".join(wider)
            + ". A family with no published run gets the band above, and `fit` says it has none.")


def write_report(doc: Path) -> None:
    """Replace the section between the markers of ``doc`` (atomically)."""
    from shardplan.support.atomic_write import write_text_atomic
    from shardplan.support.errors import ShardplanError

    try:
        text = doc.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ShardplanError("doc", str(doc), f"cannot be read ({type(err).__name__})") from None
    if BEGIN not in text or END not in text.split(BEGIN, 1)[-1]:
        raise ShardplanError("doc", str(doc), f"has no {BEGIN} … {END} section to replace")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    write_text_atomic(doc, head + report_markdown() + tail)


def main(argv: list[str]) -> int:
    """``python -m shardplan.validation.tokens [DOC]``: the report on stdout, or written into DOC's
    marked section; bad input is one line on stderr and exit 2."""
    from shardplan.support.errors import ShardplanError

    if len(argv) > 1 or any(a.startswith("-") for a in argv):
        print("usage: python -m shardplan.validation.tokens [DOC.md]  (no DOC: print the report)", file=sys.stderr)
        return 2
    try:
        if argv:
            write_report(Path(argv[0]))
        else:
            print(report_markdown())
    except ShardplanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # python -m shardplan.validation.tokens [docs/accuracy.md]
    sys.exit(main(sys.argv[1:]))
