"""Text and JSON rendering of ``shardplan plan`` results (formatting only; numbers come from planner)."""

from __future__ import annotations

from shardplan.cli import layout
from shardplan.inputs.units import GiB
from shardplan.planning.planner import SECOND_CRITERION, Plan, PlanResult

_METHOD_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}


def _other_methods(result: PlanResult, width: int | None) -> list[str]:
    """The best plan of each method not asked for, apart: the answer to another question."""
    if not result.other_methods:
        return []
    names = "/".join(_METHOD_WORDS.get(p.method, p.method) for p in result.other_methods)
    lines = ["", f"If you would accept {names} (the best plan of each; not ranked with "
                 f"{_METHOD_WORDS.get(result.method, result.method)}, --method to rank one):"]
    lines.append(layout.table([["·"] + row[1:] for row in _rows(result.other_methods, True)],
                              _headers(result.other_methods[0]), width))
    return lines


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds:,.0f} s"


def _rows(plans: list[Plan], ranked: bool) -> list[list]:
    rows = []
    for p in plans:
        label = (f"{p.rank}=" if p.equal_to_best and p.rank > 1 else p.rank) if ranked else "≈"
        rows.append([label, p.method, p.strategy, p.engine, p.ac, p.offload, p.micro_batch, p.grad_accum,
                     "" if p.strategy not in ("hybrid_shard", "hybrid_shard_zero2") else p.shard_group_size,
                     "every" if p.sync_every_micro_batch else "once", p.reduce_dtype,
                     f"{p.tokens_per_s_per_gpu:,.0f} ({p.tokens_per_s_per_gpu_low:,.0f}-{p.tokens_per_s_per_gpu_high:,.0f})",
                     f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}", f"{p.step_time_s:,.2f}", f"{p.exposed_comm_s * 1e3:,.0f}",
                     f"{p.peak_allocated_bytes / GiB:,.1f}", f"{p.band_bytes / GiB:,.1f}", f"{p.margin_bytes / GiB:,.1f}"]
                    + ([f"{_duration(p.time_to_train_s)}", f"{p.gpu_hours:,.0f}"] if p.time_to_train_s else [])
                    + ([f"${p.cost:,.0f}"] if p.cost is not None else []))
    return rows


def _headers(first: Plan) -> list[str]:
    headers = ["#", "method", "strategy", "engine", "AC", "offload", "mb", "accum", "group", "sync", "reduce", "tok/s/GPU (band)",
               "tok/s", "MFU", "step s", "exposed ms", "peak GiB", "± band GiB", "margin GiB"]
    if first.time_to_train_s:
        headers += ["time", "GPU-h"]
    if first.cost is not None:
        headers += ["cost"]
    return headers


def render_plan(result: PlanResult, width: int | None = None) -> str:
    """The plans as text, fitted to ``width`` columns (None: every line whole, ``--wide``): a table
    too wide is printed as column groups, each repeating the plan's '#'."""
    lines = [f"note: {n}" for n in result.notes] + ([f"stack: {result.stack}"] if result.stack else [])
    w = result.workload
    others = [m for m in result.methods if m != result.method]
    lines.append(f"{result.model['display_name']} on {result.cluster['label']} ({result.cluster['intra_link']} / "
                 f"{result.cluster['inter_link']}), seq {w.seq_len}, global batch {w.global_batch_tokens:,} tokens "
                 f"({w.sequences_per_gpu} sequence(s) per GPU); {result.candidates:,} candidates; "
                 f"{result.method_fitting:,} {_METHOD_WORDS.get(result.method, result.method)} plans fit with their "
                 f"error band, {result.tight_count:,} tight; "
                 f"{'calibrated' if result.calibrated else 'nameplate'} coefficients"
                 + (f"; ranked: {result.method}, the method asked (--method {' or '.join(others)} ranks another)"
                    if others else ""))
    lines.append("")
    if not result.plans:
        lines.append(f"✗ {result.explanation}")
    else:
        rows = _rows(result.plans, True)
        headers = _headers(result.plans[0])
        lines.append(layout.table(rows, headers, width))
        lines.append("")
        for p in result.plans:
            lines.append(f"#{p.rank} {p.method} {p.strategy}/{p.engine}: " + "; ".join(p.why))
        if any(p.equal_to_best and p.rank > 1 for p in result.plans):
            lines.append(f"'N=': an equal of #1 (the tokens/s bands overlap); equals are ordered by {SECOND_CRITERION}")
    lines += _other_methods(result, width)
    if result.tight:
        lines.append("")
        lines.append(f"Tight (the peak fits, the peak + its error band does not; not ranked, best {len(result.tight)} "
                     f"of {result.tight_count:,}):")
        rows, headers = _rows(result.tight, False), _headers(result.tight[0])
        # split into column groups, the rows are matched by their '#': number them
        labels = ["≈"] * len(rows) if layout.fits(rows, headers, width) else [f"≈{i}" for i in range(1, len(rows) + 1)]
        lines.append(layout.table([[label] + row[1:] for label, row in zip(labels, rows)], headers, width))
        for label, p in zip(labels, result.tight):
            lines.append(f"{label} {p.method} {p.strategy}/{p.engine}, AC {p.ac}, offload {p.offload}, mb {p.micro_batch}: "
                         + "; ".join(p.why))
    if result.rejected:
        lines.append("")
        lines.append("Rejected strategy families (no micro-batch, AC or offload setting fits):")
        # in detail for the methods that have a plan (or for all when none has); one line for the others
        shown = {result.method}
        for r in result.rejected:
            if r.method in shown:
                lines.append(f"  ✗ {r.method} {r.strategy}/{r.engine}: {r.reason}; largest term {r.largest_term} "
                             f"{r.largest_term_bytes / GiB:,.1f} GiB")
        for method in dict.fromkeys(r.method for r in result.rejected if r.method not in shown):
            families = [r for r in result.rejected if r.method == method]
            # closest: a tight family, else the smallest GPU-memory shortfall (host RAM / loading limits last)
            best = min(families, key=lambda r: ("tight" not in r.reason, not r.reason.startswith("GPU memory"),
                                                r.device_total_bytes))
            if method in {p.method for p in result.other_methods}:  # it has a plan above: say only how many failed
                lines.append(f"  ✗ {method}: {len(families)} of its families do not fit (its best plan is above)")
                continue
            lines.append(f"  ✗ {method}: none of its {len(families)} families fits; closest {best.strategy}/{best.engine}: "
                         f"{best.reason}")
    return layout.join(lines, width)


def plan_to_json(result: PlanResult) -> str:
    return result.model_dump_json(indent=2)
