"""`python -m bench.chaos`: see bench.chaos.run."""

from bench.chaos.run import main

main()
