"""The SLO planner benchmark's table (bench/loadgen/planner_bench.sh).

Reads OUT/SETUP-PHASE-roundR.json (pdserve_loadgen reports) and writes
OUT/results.md and OUT/results.json: per phase and setup, SLO attainment
(requests meeting both the TTFT and the mean-ITL SLO over all requests sent
in the phase; a failed request is a miss) and goodput (those requests per
second of the phase), per round and as the mean over rounds; then the whole
run. Goodput divides by the phase length, the same for every setup, so a
setup whose backlog outlasts the phase is not credited with a longer window.
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ttft_slo", type=float, required=True)
    ap.add_argument("--itl_slo", type=float, required=True)
    ap.add_argument("--phases", required=True)
    ap.add_argument("--setups", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    a = ap.parse_args()
    phases, setups = a.phases.split(), a.setups.split()
    rows, table = {}, []
    for setup in setups:
        for r in range(1, a.rounds + 1):
            times = json.load(open(os.path.join(a.out, f"{setup}-round{r}.times.json")))
            for phase in phases:
                rep = json.load(open(os.path.join(a.out, f"{setup}-{phase}-round{r}.json")))
                req = rep["requests"]
                rows[(setup, phase, r)] = {
                    "sent": req["sent"],
                    "failed": req["failed"],
                    "good": rep["goodput"]["good_requests"],
                    "phase_s": times["phase_s"],
                    "ttft_p90": rep["latency_s"]["ttft"]["p90"],
                    "tpot_p90": rep["latency_s"]["tpot"]["p90"],
                }

    def agg(setup, phase_list, r_list):
        sel = [rows[(setup, p, r)] for p in phase_list for r in r_list]
        sent = sum(x["sent"] for x in sel)
        good = sum(x["good"] for x in sel)
        secs = sum(x["phase_s"] for x in sel)
        return {
            "attainment": good / sent if sent else 0.0,
            "goodput": good / secs if secs else 0.0,
            "sent": sent,
            "good": good,
            "failed": sum(x["failed"] for x in sel),
        }

    rounds = list(range(1, a.rounds + 1))
    lines = [
        f"SLOs: TTFT <= {a.ttft_slo:g} s and mean ITL (TPOT) <= {a.itl_slo * 1e3:g} ms per request; "
        f"attainment = share of requests sent that met both; goodput = such requests per second of the phase.",
        "",
        "| phase | setup | attainment (mean of rounds) | goodput req/s | per round: attainment / goodput "
        "| TTFT p90 s | TPOT p90 ms | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    result = {}
    for phase in phases + ["whole run"]:
        plist = phases if phase == "whole run" else [phase]
        for setup in setups:
            m = agg(setup, plist, rounds)
            per = " ; ".join(
                f"{agg(setup, plist, [r])['attainment']:.0%} / {agg(setup, plist, [r])['goodput']:.2f}"
                for r in rounds)
            if phase == "whole run":
                ttft = tpot = "-"
            else:
                ttft = "/".join(f"{rows[(setup, phase, r)]['ttft_p90']:.2f}" for r in rounds)
                tpot = "/".join(f"{rows[(setup, phase, r)]['tpot_p90'] * 1e3:.0f}" for r in rounds)
            name = f"**{phase}**" if phase == "whole run" else phase
            lines.append(f"| {name} | {setup} | {m['attainment']:.1%} | {m['goodput']:.3f} | {per} "
                         f"| {ttft} | {tpot} | {m['failed']} |")
            result.setdefault(phase, {})[setup] = m
    text = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "results.md"), "w").write(text)
    json.dump(result, open(os.path.join(a.out, "results.json"), "w"), indent=2)
    print(text)


if __name__ == "__main__":
    main()
