"""`python3 -m ferrybench` (bench/run.sh quick|full)."""

from .cli import main

main()
