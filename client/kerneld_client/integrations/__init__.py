"""kerneld behind other libraries' kernel loaders. Nothing here is imported eagerly.

- `kerneld_client.integrations.kernels`: the `kernels` package (and so Transformers'
  `from_pretrained(..., use_kernels=True)`) resolves kernels through kerneld after `install()`,
  or from interpreter start with `KERNELD_HOOK_KERNELS=1` (the `kerneld_client_hook.pth` file this
  package installs runs `_autohook`). See docs/transformers.md.
- `kerneld_client.integrations.diffusers`: attached by the `kernels` hook, it answers Diffusers'
  publisher question for its hub attention backends from kerneld's verdict (no Hub request, the
  site's `[trust]` policy). See docs/diffusers.md.
"""
