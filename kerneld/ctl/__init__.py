"""kerneldctl: the admin command-line interface."""
