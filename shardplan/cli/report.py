"""All text formatting lives here: verdicts, breakdown tables, alternatives, JSON."""

from __future__ import annotations

import json
import re
from typing import Iterable

from tabulate import tabulate

from shardplan.cli import layout
from shardplan.formulas.memory import BREAKDOWN_TERMS
from shardplan.inputs.units import GiB
from shardplan.planning.fit import FitResult

TERM_NOTES = {
    "params": "sharded parameters at rest (fp32 master under mixed precision; 16-bit/NF4 frozen base for LoRA/QLoRA)",
    "grads": "sharded gradients (fp32 under mixed precision) held at this moment",
    "grad_buckets": "DDP gradient buckets (gradient_as_bucket_view=False)",
    "master_params": "DeepSpeed fp32 master weights + fp32 gradient partition",
    "optimizer_states": "optimizer moments (AdamW: exp_avg + exp_avg_sq)",
    "activations": "tensors saved for backward by every block (+ final norm)",
    "logits_and_loss": "forward: 16-bit logits + fp32 upcast + fp32 log-softmax (10·bsV; chunked CE: 6 + 4/C); "
                       "backward: 12·bsV (chunked: 4 + 10/C)",
    "unsharded_params": "unsharded 16-bit params of the unit being computed",
    "all_gather_buffers": "the last all-gather output, kept until the next unit's wait",
    "unsharded_grads": "current unit's unsharded gradients",
    "reduce_scatter_buffers": "reduce-scatter input in the reduce dtype (kept until the next unit's)",
    "root_unsharded": "root unit (embeddings, final norm, lm_head), gathered again for backward and held to its end",
    "root_grads": "lm_head and final-norm gradients, computed first in backward",
    "autocast_weight_copies": "16-bit weight copies autocast saves for backward (DDP)",
    "gathered_params": "DeepSpeed ZeRO-3: one gathered module's 16-bit params + grads (4·L)",
    "comm_buckets": "DeepSpeed reduce bucket (16-bit)",
    "qlora_dequant": "QLoRA: dequantized 16-bit weights (one Linear; compiled torchao: those saved for backward)",
    "optimizer_step_temporaries": "foreach AdamW temporaries (sqrt of exp_avg_sq)",
}


def gib(n: int | float) -> str:
    return f"{n / GiB:,.2f}"


def _engine(r: FitResult) -> str:
    return "no wrapper" if r.strategy == "single" else r.engine


BAND_LABELS = {"model_states": "model states", "activations": "activations", "engine_buffers": "engine buffers",
               "peak_moments": "unmodelled sub-moments", "allocator": "allocator", "non_torch": "non-torch",
               "unknown_stack": "unknown stack"}


def verdict(r: FitResult) -> str:
    """The headline: ✓ FITS / ≈ TIGHT (which term carries the risk, what to change) / ✗ DOES NOT FIT."""
    where = f"{r.cluster['label']} ({r.gpu['name']}, {gib(r.gpu['memory_bytes'])} GiB each)"
    what = f"{r.model['display_name']} {r.config['method']} with {r.strategy} ({_engine(r)}) on {where}"
    if not r.valid:
        return f"✗ {r.strategy}/{r.engine}: not a valid combination"
    peak = "load-time peak" if r.judged_peak == "load" else "per GPU"
    need = f"{gib(r.judged_bytes)} GiB {peak} ± {gib(r.band_bytes)} GiB"
    if r.verdict == "fits":
        return (f"✓ FITS  {what}: {need}, {gib(r.margin_bytes)} GiB to spare after the band; "
                f"load-time peak {gib(r.per_gpu.load_peak_bytes)} GiB ({r.config.get('load_mode')})")
    if r.verdict == "tight":
        risk = f"{BAND_LABELS[r.risk_term]} ±{gib(r.band[r.risk_term])} GiB could exceed {gib(r.gpu['memory_bytes'])} GiB"
        return f"≈ TIGHT ({risk}: try {r.advice})  {what}: {need}, short by {gib(-r.margin_bytes)} GiB once the band is counted"
    reasons = []
    if r.fits_host and r.judged_bytes > r.gpu["memory_bytes"]:
        reasons.append(f"needs {gib(r.judged_bytes)} GiB {peak}, over by {gib(r.judged_bytes - r.gpu['memory_bytes'])} GiB")
    if not r.fits_host:
        reasons.append(f"needs {gib(r.per_node.host_bytes)} GiB host RAM per node of {gib(r.per_node.host_ram_bytes)}")
    return f"✗ DOES NOT FIT  {what}: " + "; ".join(reasons)


def band_line(r: FitResult) -> str:
    """The band per class, largest first (classes with no bytes left out)."""
    parts = [f"{BAND_LABELS[k]} {gib(v)}" for k, v in sorted(r.band.items(), key=lambda kv: -kv[1]) if v >= GiB / 200]
    return f"    band ±{gib(r.band_bytes)} GiB = " + (" + ".join(parts) or "0") + " (docs/accuracy.md)"


def tokens_line(t: dict) -> str:
    return (f"{t['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU ({t['tokens_per_s_per_gpu_low']:,.0f}-"
            f"{t['tokens_per_s_per_gpu_high']:,.0f}), {t['tokens_per_s']:,.0f} total ({t['tokens_per_s_low']:,.0f}-"
            f"{t['tokens_per_s_high']:,.0f})")


def time_band_line(band: dict) -> str:
    """What the tokens/s band rests on for the answer's GPU family (``ThroughputBand.evidence``)."""
    family, runs = band["family"], band["runs"]
    if band["calibrated"]:
        return (f"tokens/s band: the calibration's, measured on {band['band_runs']} of your runs "
                f"(/{1 + band['slower_than_predicted']:.2f} to x{1 + band['faster_than_predicted']:.2f})")
    if not runs:
        return (f"tokens/s band: no published {family} run in the development set; the band is the other GPU "
                "families' (docs/accuracy.md)")
    text = (f"tokens/s band: {runs} published {family} run{'s' if runs > 1 else ''}, signed median error "
            f"{band['median_error']:+.1%} (predicted / published - 1)")
    shown = f"/{1 + band['slower_than_predicted']:.2f} to x{1 + band['faster_than_predicted']:.2f}"
    if shown != "/{:.2f} to x{:.2f}".format(*(1 + x for x in band["all_runs"])):  # wider where it shows
        text += f"; widened to their own spread, {shown}"
    return text + " (docs/accuracy.md)"


SHORT_FOLD = 0.02  # a term under 2 % of the peak allocated is folded in the short answer's table


def breakdown_table(results: list[FitResult], width: int | None = None, short: bool = False) -> str:
    """Term by term, one column per strategy (and what each term is, for one strategy). Fitted to
    ``width`` by :func:`layout.table`: the explanation wraps; many strategies split into groups.
    ``short``: the terms and SHORT_TOTALS only, no explanations (the no-fit answer's table)."""
    notes = len(results) == 1 and not short
    headers = ["term (GiB per GPU)"] + [r.strategy for r in results] + (["what it is"] if notes else [])
    rows, small = [], []
    # the short answer folds the terms under SHORT_FOLD of the peak into one row: a no-fit answer
    # stays readable (issue 22 item 11) whichever moment is the peak; --detail lists every term
    fold = SHORT_FOLD * max(r.per_gpu.peak_allocated_bytes for r in results) if short else -1
    for term in BREAKDOWN_TERMS:
        values = [r.per_gpu.breakdown[term] for r in results]
        if not any(values):
            continue
        if max(values) < fold:
            small.append((term, values))
            continue
        rows.append([term] + [gib(v) for v in values] + ([TERM_NOTES[term]] if notes else []))
    if len(small) > 1:
        rows.append([f"({len(small)} smaller terms)"] + [gib(sum(col)) for col in zip(*(v for _, v in small))])
    elif small:  # one term is shown as itself
        rows.append([small[0][0]] + [gib(v) for v in small[0][1]])
    totals = [
        ("(model states)", [r.per_gpu.model_state_bytes for r in results],
         "params + grads + master + optimizer (+ DeepSpeed gathered module)"),
        ("= peak allocated", [r.per_gpu.peak_allocated_bytes for r in results], "sum of the terms above, at the peak moment"),
        ("peak reserved", [r.per_gpu.peak_reserved_bytes for r in results], "allocated + FSDP stream pools + allocator fragmentation"),
        ("+ CUDA context, NCCL", [r.per_gpu.non_torch_bytes for r in results], "outside torch's allocator (+ paged optimizer states)"),
        ("= device total", [r.per_gpu.device_total_bytes for r in results], "compared with the GPU's memory"),
        ("load-time peak", [r.per_gpu.load_peak_bytes for r in results],
         "while the weights reach the GPU (load mode), also compared with its memory"),
        ("± band", [r.band_bytes for r in results], "error band of the judged peak, per term class (docs/accuracy.md)"),
        ("margin", [r.margin_bytes for r in results], "capacity - judged peak - band"),
        ("host RAM per node", [r.per_node.host_bytes for r in results], "offloaded states, processes, checkpoint load"),
    ]
    for label, values, note in totals:
        if not short or label in SHORT_TOTALS:
            rows.append([label] + [gib(v) for v in values] + ([note] if notes else []))
    if short:
        return layout.table(rows, headers, width)
    rows.append(["peak moment"] + [r.per_gpu.peak_moment for r in results]
                + (["forward (loss), backward, or optimizer step"] if notes else []))
    rows.append(["verdict"] + [r.verdict for r in results] + (["fits: peak + band <= capacity; tight: peak - lower band is"]
                                                               if notes else []))
    return layout.table(rows, headers, width, wrap_columns=(len(headers) - 1,) if notes else ())


_FLAGS = re.compile(r" \(--[^)]*\)")  # "(--ac full)": the options that make a change, spelled out in the legend


def alternatives_lines(r: FitResult, width: int | None = None) -> list[str]:
    """The alternatives table; when it is wider than ``width``, the 'limit' column becomes a
    numbered legend under the table that also gives each change in full (with its options), and
    the table shows the change without its options."""
    wide = alternatives_table(r)
    if width is None or layout.text_width(wide) <= width:
        return [layout.Table(wide)]
    mark = {"fits": "✓", "tight": "≈", "does_not_fit": "✗"}
    rows = [[f"{mark[a.verdict]} {n}", _FLAGS.sub("", a.change), gib(a.peak_allocated_bytes),
             gib(a.device_total_bytes), gib(a.band_bytes), gib(a.margin_bytes)]
            for n, a in enumerate(r.alternatives, 1)]
    headers = ["#", f"change (from {r.strategy})", "peak alloc GiB", "device total GiB", "± band GiB", "margin GiB"]
    lines: list[str] = [layout.table(rows, headers, width, wrap_columns=(1,), key_columns=2),
                        "", "legend (#: the change in full, then its limit):"]
    for n, a in enumerate(r.alternatives, 1):
        limit = a.limit or ("" if a.fits else "within the band")
        entry = f"{n:>{len(str(len(r.alternatives)))}}. {a.change}" + (f": {limit}" if limit else "")
        lines.append(layout.Table("\n".join(layout.wrap(entry, width, hang=len(str(len(r.alternatives))) + 2))))
    return lines


def alternatives_table(r: FitResult) -> str:
    mark = {"fits": "✓", "tight": "≈", "does_not_fit": "✗"}
    rows = [[mark[a.verdict], a.change, gib(a.peak_allocated_bytes), gib(a.device_total_bytes), gib(a.band_bytes),
             gib(a.margin_bytes), a.limit or ("" if a.fits else "within the band")]
            for a in r.alternatives]
    return tabulate(rows, headers=["", f"change (from {r.strategy})", "peak alloc GiB", "device total GiB", "± band GiB",
                                   "margin GiB", "limit"],
                    tablefmt="simple", disable_numparse=True)


def _stack_knobs(cfg: dict) -> str:
    """The stack knobs that are on, in words (after the stack line)."""
    on = []
    if cfg.get("ce_chunks"):
        on.append(f"chunked CE x{cfg['ce_chunks']}")
    for key, words in (("optimizer_in_backward", "optimizer in backward"), ("activation_offload", "activation offload"),
                       ("paged_optimizer", "paged optimizer (counted on the GPU)")):
        if cfg.get(key):
            on.append(words)
    if cfg.get("fp32_master") is False:
        on.append("no fp32 master")
    if cfg.get("fused_lm_head"):
        on.append("TRL chunked LM head (no logits)")
    if cfg.get("logits_fp32") is False:
        on.append("loss on 16-bit logits")
    if cfg.get("method") == "qlora":
        plugin = " (qweight/qzeros sharded as parameters: fms-gptq)" if cfg.get("quant_buffers_sharded") else ""
        on.append(f"4-bit base {cfg.get('quant_format')}{plugin}")
    on.append(f"load {cfg.get('load_mode')}")
    return " — " + ", ".join(on)


def _head(first: FitResult) -> list[str]:
    """The notes, the stack and the configuration the answer assumed (defaults included)."""
    cfg = first.config
    return [*(f"note: {note}" for note in first.notes), f"stack: {first.stack}" + _stack_knobs(cfg),
            f"model {first.model['display_name']} ({first.model['params']:,} params), method {cfg['method']}, "
            f"precision {cfg['precision']}, optimizer {cfg['optimizer']}, seq {cfg['seq_len']}, "
            f"micro-batch {cfg['micro_batch']}, AC {cfg['ac']}, offload {cfg['offload']}", ""]


# The rows of the short no-fit term table: the terms, then what is compared with capacity.
SHORT_TOTALS = ("= peak allocated", "= device total", "± band", "margin")
SHORT_ALTERNATIVES = 4  # the changes with the most margin; --detail lists every one
DETAIL_HINT = "--detail: each strategy's terms, the band by class, reserved, load and host-RAM peaks, all changes"


def render_no_fit(results: list[FitResult], width: int | None = None) -> str:
    """A no-fit answer in short (issue 22: <= 45 lines at 100 columns): one line per strategy, the
    terms of the smallest footprint, and the cheapest changes; ``--detail`` prints ``render_fit``."""
    best = min(results, key=lambda r: r.per_gpu.device_total_bytes)
    r0 = results[0]
    lines = _head(r0) + [f"✗ DOES NOT FIT  {r0.model['display_name']} {r0.config['method']} on {r0.cluster['label']} "
                         f"({r0.gpu['name']}, {gib(r0.gpu['memory_bytes'])} GiB each):"]
    same: dict[str, list[str]] = {}  # strategies with the same numbers share a line (hybrid_shard = full_shard here)
    for r in results:
        same.setdefault(_short_verdict(r).replace(r.strategy, "{}", 1), []).append(r.strategy)
    lines += ["  " + text.replace("{}", ", ".join(names), 1) for text, names in same.items()]
    lines += ["", breakdown_table([best], width, short=True), ""]
    why = "once its error band is counted" if any(r.verdict == "tight" for r in results) else "as asked"
    closest = sorted(best.alternatives, key=lambda a: -a.margin_bytes)[:SHORT_ALTERNATIVES]
    shown = f"the {len(closest)} closest of {len(best.alternatives)}" if len(closest) < len(best.alternatives) else "all"
    lines.append(f"Nothing fits {why}. Changes tried on {best.strategy} (the smallest footprint), {shown}:")
    lines += alternatives_lines(best.model_copy(update={"alternatives": closest}), width)
    lines += ["", DETAIL_HINT]
    return layout.join(lines, width)


def _short_verdict(r: FitResult) -> str:
    """'✗ full_shard (fsdp2): 336.53 ± 69.52 GiB per GPU, over by 312.89 GiB' (or its host-RAM need)."""
    mark = {"tight": "≈", "fits": "✓"}.get(r.verdict, "✗")
    if not r.valid:
        return f"✗ {r.strategy}/{r.engine}: not a valid combination"
    text = f"{mark} {r.strategy} ({_engine(r)}): {gib(r.judged_bytes)} ± {gib(r.band_bytes)} GiB"
    if not r.fits_host:
        return text + f"; host RAM {gib(r.per_node.host_bytes)} of {gib(r.per_node.host_ram_bytes)} GiB per node"
    over = r.judged_bytes - r.gpu["memory_bytes"]
    return text + (f", over by {gib(over)} GiB" if over > 0 else f", short by {gib(-r.margin_bytes)} GiB with the band")


def render_fit(results: list[FitResult], width: int | None = None, detail: bool = True) -> str:
    """The fit answer as text, fitted to ``width`` columns (None: every line whole, ``--wide``); a
    no-fit answer of several strategies is short unless ``detail`` (``render_no_fit``)."""
    if not detail and len(results) > 1 and not any(r.fits for r in results):
        return render_no_fit(results, width)
    first = results[0]
    lines: list[str] = _head(first)
    for r in results:
        lines.append(verdict(r))
        if r.valid:
            lines.append(band_line(r))
        if r.time:
            t = r.time
            lines.append(f"    step {t['step_time_s']:.3f} s (compute {t['compute_s']:.3f} s, exposed comm "
                         f"{t['exposed_comm_s']:.3f} s), {tokens_line(t)}, MFU {t['mfu']:.1%}")
            if r.efficiencies:
                lines.append("    efficiencies: " + ", ".join(f"{e['name']} {e['value']:.3f} ({e['status']})"
                                                            for e in r.efficiencies))
            if r.time_band:
                lines.append("    " + time_band_line(r.time_band))
    lines.append("")
    lines.append(breakdown_table(results, width))
    failing = [r for r in results if not r.fits]
    if len(failing) == len(results):
        best = min(results, key=lambda r: r.per_gpu.device_total_bytes)
        lines.append("")
        why = "once its error band is counted" if any(r.verdict == "tight" for r in results) else "as asked"
        lines.append(f"Nothing fits {why}. Cheapest changes, tried on {best.strategy} (the smallest footprint):")
        lines += alternatives_lines(best, width)
    elif failing and len(results) == 1:
        lines.append("")
        lines += alternatives_lines(failing[0], width)
    return layout.join(lines, width)


def to_json(results: Iterable[FitResult] | FitResult) -> str:
    if isinstance(results, FitResult):
        return results.model_dump_json(indent=2)
    return json.dumps([r.model_dump(mode="json") for r in results], indent=2)
