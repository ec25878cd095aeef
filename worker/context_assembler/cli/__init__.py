"""`context-assembler`: the command line (`main.main` is the entry point)."""
