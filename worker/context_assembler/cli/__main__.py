"""`python -m context_assembler.cli`: the same as the `context-assembler` command."""

import sys

from context_assembler.cli.main import main

sys.exit(main())
