# The results layout for the shell suites (see bench/README.md, "Results"):
# bench/results/<date>-<suite>-<tag>/ with raw/, then summary.json and
# results.md written from raw/*.json by bench/ferrybench/layout.py.
# Source it after setting $root to the repository.

# bench_results_dir SUITE TAG: makes the run's directory (and raw/) and
# prints its path.
bench_results_dir() {
  PYTHONPATH="$root/bench" python3 -m ferrybench.layout new "$1" "$2"
}

# bench_results_finish DIR PINNING: summary.json and results.md from
# DIR/raw/*.json, with the commit, the machine and PINNING (which CPUs ran
# what).
bench_results_finish() {
  PYTHONPATH="$root/bench" python3 -m ferrybench.layout finish "$1" --pinning "$2"
}
