"""`python -m chaos`: the chaos/soak harness (see chaos.harness)."""

import sys

from chaos.harness import main

sys.exit(main())
