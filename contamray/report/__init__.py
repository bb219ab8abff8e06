"""What a person reads after a run or a sweep.

- ``markdown.write_report``: a run's ``report.md`` (its verdict table and resolved config);
- ``html.write_html_report(run_dirs, out_dir, correction, alpha)``: the cross-model ``report.html``
  (plus ``tables.md``, ``cells.csv``, ``plots/``) of one or more runs — the ``contamray report`` command;
- its parts: ``runs`` (read and merge run directories), ``correction`` (Holm, Benjamini–Hochberg),
  ``tables`` (one table per method, rows models, columns partitions), ``scores`` (each method's
  per-example score), ``plots`` (heatmaps, score distributions).

Nothing is imported here, so ``contamray.report.markdown`` stays light (no matplotlib).
"""
