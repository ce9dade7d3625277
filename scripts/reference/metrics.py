"""The metrics table of docs/operations.md: what a `kerneld.server.plumbing.metrics.Metrics`
registry exports, by exposition name (counters with `_total`), with type, labels and help text."""

from __future__ import annotations

from scripts.reference.markdown import BEGIN, END, cell


def metric_names() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """Exposition name -> (type, labels, help) of every metric the daemon exports."""
    from kerneld.server.plumbing.metrics import Metrics, StoreGauges

    metrics = Metrics()
    metrics.watch_store(lambda: StoreGauges(0, 0, 0, 0, 0, 0))
    labels: dict[str, tuple[str, ...]] = {
        str(m._name): tuple(m._labelnames)
        for m in vars(metrics).values()
        if hasattr(m, "_labelnames") and hasattr(m, "_name")
    }
    out: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (family.type, labels.get(family.name, ()), family.documentation)
    return out


def generate_metrics() -> str:
    lines = [BEGIN, "", "| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for name, (kind, labels, doc) in metric_names().items():
        label_text = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| `{name}` | {kind} | {label_text} | {cell(doc)} |")
    return "\n".join([*lines, "", END]) + "\n"
