"""Real processes for the tests and the benchmarks alike: daemons on free ports torn down by
pid (``harness``), an event loop that fails on hidden errors (``loop``), TLS certificates
(``certs``) and a Spark standalone cluster with the pipeline (``spark_helpers``). Both
``tests/`` and ``bench/`` import it; it imports neither."""
