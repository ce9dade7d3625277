"""The documented systemd install, executed under a real systemd (systemd-nspawn --boot)."""
