"""Child process of a throw-away venv: one released `kernels`, unmodified, as a job calls it.

    python _kernels_release_child.py '{"repo": "org/name", "version": 1}'

Run by path (not `-m tests...`): nothing of kerneld's or of the tests is importable here.
Prints one JSON object: the kernels release, the loaded file, and whether its op computes
silu(a) * b as PyTorch does; or the error's type and message.
"""

from __future__ import annotations

import json
import sys

import torch  # a training job's first import; the suite forks such jobs (tests/support/zygote.py)


def main() -> None:
    args = json.loads(sys.argv[1])
    from importlib.metadata import version

    import kernels

    out: dict[str, object] = {"kernels": version("kernels")}
    try:
        module = kernels.get_kernel(args["repo"], version=args.get("version", 1))
    except Exception as exc:
        out.update(error=type(exc).__name__, message=str(exc))
    else:
        x = torch.randn(4, 16)
        expected = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
        torch.testing.assert_close(module.silu_and_mul_alloc(x), expected)
        out.update(file=module.__file__, ops_ok=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
