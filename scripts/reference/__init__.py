"""The generators behind scripts/gen_reference.py, one module per reference it writes: the
kerneld.toml keys (`config_keys`), the environment variables (`environment`), the `kerneld`
flags (`flags`) and the metrics (`metrics`); `markdown` holds what their tables share."""

from pathlib import Path

#: The repository root.
ROOT = Path(__file__).resolve().parents[2]
