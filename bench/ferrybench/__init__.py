"""The DERP suite: Ferry against derper (and a ceiling forwarder), side by
side. `bench/run.sh quick|full` runs it (`python3 -m ferrybench` with
bench/ on the path); the soaks (bench/soak.py) use its servers and runs.

- `cli`: the command line and one run from build to outputs.
- `plans`: the quick and full plans and the command line's changes.
- `build`, `certs`: the binaries under test, throw-away certificates.
- `servers`: a server process (Ferry, derper, the ceiling, Hyper-DERP)
  and a two-node region of one.
- `context`: ferry-bench run once per point, retried, recorded.
- `suites`: rate, latency, peers, idle, churn, stuck, mesh.
- `summary`: medians and spreads, the headline rows and their bars.
- `render`, `plots`: results.md and headline.md, the PNG plots.
- `sanity`: whether a report's numbers make sense.
- `outputs`: summary.json and the rest of an output directory, the
  machine, `--rerender`.
- `layout`: bench/results/<date>-<suite>-<tag>/ for every suite under
  bench/ (summary.json, results.md, raw/), and `finish` for the suites
  that write only JSON (the soaks, the shell scripts).
- `common`: paths, the known servers, the traffic shape, logging.
"""
