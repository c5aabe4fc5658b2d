"""Plots the SLO planner's decisions and pool sizes over time
(bench/loadgen/planner_bench.sh): OUT/planner-roundR.jsonl -> OUT/planner.png.

One column per round: pool sizes (ready workers, and the size the planner
set), the latency it read against each SLO, and the reason of each change,
with the workload's phases shaded. Needs matplotlib (Debian:
python3-matplotlib).
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ["prefill-heavy", "decode-heavy", "mixed"]
SHADES = ["#fde0c5", "#c6dbef", "#e5f5e0"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--phase_s", type=float, required=True)
    a = ap.parse_args()
    fig, axes = plt.subplots(3, a.rounds, figsize=(9 * a.rounds, 9), squeeze=False, sharex="col")
    for r in range(1, a.rounds + 1):
        path = os.path.join(a.out, f"planner-round{r}.jsonl")
        times = json.load(open(os.path.join(a.out, f"planner-round{r}.times.json")))
        t0 = times["start"]
        lines = [json.loads(x) for x in open(path) if x.strip()]
        ax_size, ax_lat, ax_load = axes[0][r - 1], axes[1][r - 1], axes[2][r - 1]
        warmup = float(times.get("warmup_s", 0))
        for ax in (ax_size, ax_lat, ax_load):
            if warmup > 0:
                ax.axvspan(-warmup, 0, color="0.9", label="warm-up (mixed, not measured)"
                           if ax is ax_size else None)
            for i, name in enumerate(PHASES):
                ax.axvspan(i * a.phase_s, (i + 1) * a.phase_s, color=SHADES[i], alpha=0.6,
                           label=name if ax is ax_size else None)
        for pool, color in (("prefill", "tab:orange"), ("decode", "tab:blue")):
            pts = [x for x in lines if x["pool"] == pool]
            t = [x["time"] - t0 for x in pts]
            ax_size.step(t, [x["desired"] for x in pts], where="post", color=color, lw=2,
                         label=f"{pool}: set by the planner")
            ax_size.plot(t, [x["ready"] for x in pts], ".", color=color, ms=3,
                         label=f"{pool}: registered")
            lat = [x["latency_s"] for x in pts]
            ax_lat.plot([ti for ti, v in zip(t, lat) if v is not None],
                        [v for v in lat if v is not None], color=color,
                        label=("TTFT" if pool == "prefill" else "ITL") + " p90 (router)")
            ax_load.plot(t, [x["load"] if x["load"] is not None else float("nan") for x in pts],
                         color=color, label=f"{pool} load (tokens/s)")
            for x, ti in zip(pts, t):
                if x["desired"] != x["current"]:
                    ax_size.annotate(x["reason"], (ti, x["desired"]), fontsize=7, rotation=30,
                                     color=color, xytext=(2, 4), textcoords="offset points")
        ax_size.set_ylabel("workers")
        ax_size.set_ylim(0, 3.5)
        ax_size.set_title(f"pdserve_planner, round {r}: 3-worker budget, "
                          "decisions and pool sizes")
        ax_size.legend(fontsize=7, loc="upper right", ncol=2)
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel("latency (s)")
        ax_lat.legend(fontsize=7, loc="upper right")
        ax_load.set_ylabel("tokens/s")
        ax_load.set_xlabel("seconds since the workload started")
        ax_load.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "planner.png"), dpi=110)
    print(f"plot: {os.path.join(a.out, 'planner.png')}")


if __name__ == "__main__":
    main()
