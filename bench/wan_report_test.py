"""bench/wan_report.py on hand-made results (ctest python.wan_report): rates with a round trip, repeats of a row
(the representative is the median final loss; `has` and `collect` tell repeats apart), and the report's Repeats
and push-accounting sections. Needs Debian's /usr/bin/python3 (matplotlib, for the plots the report draws)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import wan_report as wr  # noqa: E402


def row(method, rate, repeat, final, hit_at, e2e):
    # Evaluations (seconds, loss, tokens): 3.0 at 5 s, then `final` at 30 s; the target 2.5 is reached at hit_at.
    evals = [[5.0, 3.0, 1000], [hit_at, 2.5, 2000], [30.0, final, 4000]]
    r = {"model": "demo", "method": method, "rate": rate, "config": "configs/demo.toml", "params": 1, "learners": 2,
         "steps": 400, "max_seconds": 90.0, "wall": 31.0, "rc": 0, "commit": "test", "started": 0.0,
         "batch_tokens": 1024, "link_bytes": [[1, 1], [1, 1], [1, 1]], "tokens_per_s": 1000.0,
         "learner_hosts": [{"learner": n, "steps": 400, "tokens_per_s": 1000.0, "busy_fraction": 0.9, "joined_t": 2.0,
                            "last_step_t": 28.0, "bytes_sent": 1, "bytes_received": 1, "wall_seconds": 29.0,
                            "busy_seconds": 26.0, "wait_seconds": 0.0, "pushes": 35, "broadcasts": 35,
                            "pushes_dropped": 0, "pushes_superseded": 5, "finished": True, "ranks": 1}
                           for n in range(2)],
         "e2e_tokens_per_s": e2e, "steps_reached": 400, "bounded": False, "degraded": [], "broke": [],
         "evals": evals, "merges": 10, "merge_times": {}}
    if repeat is not None:
        r["repeat"] = repeat
    if method == "decoupled":
        r["push_accounting"] = {"due": 80, "sent": 70, "unsent": {"superseded": 10, "dropped": 0, "at_end": 0},
                                "merged": 69, "unmerged": {"refused": 0, "replaced": 1, "pending_at_end": 0},
                                "unaccounted": 0}
    return r


def main():
    assert wr.split_rate("10mbit@50ms") == ("10mbit", 50.0)
    assert wr.split_rate("none") == ("none", 0.0)
    assert wr.rate_mbit("10mbit@150ms") == 10.0
    assert wr.rate_label("100mbit@50ms") == "100 Mbit/s, 50 ms RTT"
    assert wr.rate_label("none") == "unshaped"
    try:
        wr.split_rate("10mbit@50")
        raise AssertionError("a round trip without its unit was accepted")
    except ValueError:
        pass
    with tempfile.TemporaryDirectory() as d:
        res = os.path.join(d, "r.jsonl")
        with open(res, "w") as f:
            # An old row (no "repeat" field) is repeat 0; repeats 1 and 2 of the same row; another row alone.
            f.write(json.dumps(row("decoupled", "10mbit@50ms", None, 2.30, 12.0, 900.0)) + "\n")
            f.write(json.dumps(row("decoupled", "10mbit@50ms", 1, 2.10, 10.0, 1000.0)) + "\n")
            f.write(json.dumps(row("decoupled", "10mbit@50ms", 2, 2.20, 14.0, 1100.0)) + "\n")
            f.write(json.dumps(row("ddp", "none", 0, 2.00, 20.0, 500.0)) + "\n")
            f.write(json.dumps(row("decoupled", "none", 0, 2.05, 9.0, 1200.0)) + "\n")
        every = wr.read_all(res)
        assert len(every) == 5, every.keys()
        rows = wr.read_results(res)
        assert len(rows) == 3
        assert rows[("demo", "decoupled", "10mbit@50ms")]["evals"][-1][1] == 2.20  # the median of 2.10, 2.20, 2.30
        assert [r.get("repeat", 0) for r in wr.read_repeats(res)[("demo", "decoupled", "10mbit@50ms")]] == [0, 1, 2]
        has = [sys.executable, os.path.join(HERE, "wan_report.py"), "has", "--results", res, "--model", "demo",
               "--method", "decoupled", "--rate", "10mbit@50ms", "--steps", "400"]
        assert subprocess.run(has + ["--repeat", "2"]).returncode == 0
        assert subprocess.run(has + ["--repeat", "3"]).returncode == 1
        doc = os.path.join(d, "wan.md")
        subprocess.run([sys.executable, os.path.join(HERE, "wan_report.py"), "report", "--results", res, "--doc", doc,
                        "--plots", os.path.join(d, "plots"), "--target", "demo=2.5"], check=True,
                       stdout=subprocess.DEVNULL)
        text = open(doc).read()
        assert "Rows have up to 3 repeats" in text, text[:2000]
        assert "a row marked *ms RTT* adds its round trip" in text
        line = next(x for x in text.splitlines() if x.startswith("| Decoupled DiLoCo | 10 Mbit/s, 50 ms RTT | 3 |"))
        # final loss median [min–max]; time to target median [min–max] (3 of 3); end-to-end tokens/s
        assert "2.200 [2.100–2.300]" in line and "12 [10–14] (3 of 3)" in line and "1000 [900–1100]" in line, line
        # DDP's unshaped final loss (2.00): reached by none of the three (their best is 2.10)
        assert "| – (0 of 3) |" in line, line
        assert "## Every push accounted for" in text
        assert "| demo | Decoupled DiLoCo | 10 Mbit/s, 50 ms RTT | 80 | 70 | 10 | 0 | 0 | 69 | 0 | 1 | 0 | 0 |" in text
    print("wan_report test passed")


if __name__ == "__main__":
    main()
