"""Plots latency against offered load from bench/compare_litellm.sh's CSV.

Usage: python bench/plot_latency.py bench-latency.csv bench-latency.png
One panel per mode (non-streaming, streaming); p99 solid, p50 dashed; log-log axes.
"""

import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"direct": "black", "standalone": "tab:blue", "distributed": "tab:green", "litellm": "tab:red"}


def main(source: str, target: str) -> None:
    series = defaultdict(list)
    with open(source, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["p99_ms"] in ("", "NaN"):
                continue
            series[(row["mode"], row["target"])].append(
                (float(row["offered"]), float(row["p50_ms"]), float(row["p99_ms"]))
            )
    modes = sorted({mode for mode, _ in series}, key=lambda m: (m != "non-streaming", m))
    figure, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for axis, mode in zip(axes[0], modes):
        for (row_mode, name), points in sorted(series.items()):
            if row_mode != mode:
                continue
            points.sort()
            offered = [p[0] for p in points]
            color = COLORS.get(name)
            axis.plot(offered, [p[2] for p in points], marker="o", color=color, label=f"{name} p99")
            axis.plot(offered, [p[1] for p in points], linestyle="--", color=color, label=f"{name} p50")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(f"{mode}: latency against offered load")
        axis.set_xlabel("offered load (requests/s)")
        axis.set_ylabel("latency (ms), from the scheduled start")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    print(f"wrote {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_latency.py SOURCE.csv TARGET.png")
    main(sys.argv[1], sys.argv[2])
