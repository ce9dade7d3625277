"""`python -m chaos`: the chaos/soak harness (see chaos.harness)."""

import os
import sys

# Before anything imports grpc: its fork handlers off in the harness (tests/support/daemon.py).
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

from chaos.harness import main

sys.exit(main())
