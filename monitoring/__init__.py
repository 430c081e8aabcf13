"""Online monitoring: how good the ANN answers of live queries are, measured exactly; how their queries drift.

* :mod:`monitoring.recall`: tie-aware recall@k and the filter-selectivity buckets (pure functions);
* :mod:`monitoring.monitor`: :class:`~monitoring.monitor.RecallMonitor`, which samples live dense
  and hybrid searches, re-runs each exactly in a background thread (``VectorStore.search_exact``),
  serves recent figures and the reindex trigger;
* :mod:`monitoring.exact`: a sample and its measurement against exact search (the reindex check's too);
* :mod:`monitoring.drift`: :class:`~monitoring.drift.QueryDrift`, how far each collection's recent
  queries moved from a reference of its queries (query vectors' centroid, out-of-vocabulary share);
* :mod:`monitoring.metrics`: the monitor's and the drift's Prometheus series;
* :mod:`monitoring.recent`: the last sampled queries per collection, kept on disk for
  ``quarry recall`` and a reindex's verification.
"""
