"""kerneld behind other libraries' kernel loaders. Nothing here is imported eagerly.

- `kerneld_client.integrations.kernels`: the `kernels` package (and so Transformers'
  `from_pretrained(..., use_kernels=True)`) resolves kernels through kerneld after `install()`,
  or from interpreter start with `KERNELD_HOOK_KERNELS=1` (the `kerneld_client_hook.pth` file this
  package installs runs `_autohook`). See docs/transformers.md.
"""
