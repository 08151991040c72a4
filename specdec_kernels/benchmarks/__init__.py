"""Benchmarks of specdec_kernels: kernel microbenchmarks (:mod:`.ops`) and end-to-end generation
(:mod:`.e2e`), shared by ``specdec bench`` and the pytest-benchmark files in ``bench/``.

Timings are printed and saved, never asserted. Results are appended to JSON files as rows that
carry the machine, the date and the commit (:mod:`.results`); plots are drawn from that JSON by
:mod:`.plot`.
"""
