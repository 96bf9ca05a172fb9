"""What the entry points of scripts/ share to report runs: reading a run directory (``run_reading``), choosing which
runs count as seeds of which setting (``run_selection``), naming them (``run_labels``), the target-loss table, the
figures' common parts, and the reports of benches and checks (``bench_report``); and the command line that they
and the commands of evaluation/ share (``arguments``: one-line refusals, argument types that name the flag)."""
