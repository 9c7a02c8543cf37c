"""Predicted vs measured on the committed GPU campaign (data/calibration/gpu/*.jsonl).

    python benchmarks/gpu_compare.py      # writes data/calibration/gpu/predicted_vs_measured.{csv,md}

Prints the median and max error per configuration class for allocated, reserved and NVML device
memory. See docs/accuracy.md.
"""

import statistics
import sys
from pathlib import Path

import pandas as pd

from shardplan.calibrate.gpu_compare import compare_folder
from shardplan.support.atomic_write import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "data" / "calibration" / "gpu"


def summary(rows: pd.DataFrame) -> str:
    lines = ["| class | runs | allocated median / max error | reserved median / max error | device median / max error |",
             "| --- | ---: | --- | --- | --- |"]
    for name, g in rows.groupby("class"):
        cells = []
        for what in ("allocated", "reserved", "device"):
            e = g[f"{what}_error"].dropna()
            cells.append(f"{statistics.median(e) * 100:+.1f} % / {e.iloc[e.abs().argmax()] * 100:+.1f} %")
        lines.append(f"| {name} | {len(g)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    rows = pd.DataFrame(compare_folder(GPU))
    rows["class"] = rows["engine"] + " " + rows["method"] + rows["expandable_segments"].map({True: " expandable", False: ""})
    write_text_atomic(GPU / "predicted_vs_measured.csv", rows.to_csv(index=False))
    G = 2 ** 30
    table = rows.assign(**{f"{k}_GiB": (rows[f"{m}_{k}_bytes"] / G).round(2) for m in ("measured", "predicted")
                           for k in ("allocated", "reserved")})
    md = ["# Predicted vs measured on one H100 80GB (benchmarks/gpu_campaign.py, benchmarks/gpu_compare.py)", "",
          summary(rows), "", table[["model", "engine", "world_size", "method", "ac", "lora_dropout", "micro_batch",
                                    "seq_len", "optimizer", "expandable_segments", "allocated_error", "reserved_error",
                                    "device_error"]].to_markdown(index=False, floatfmt=".3f")]
    write_text_atomic(GPU / "predicted_vs_measured.md", "\n".join(md) + "\n")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
